"""FLOP counting with torch.utils.flop_counter: the numerator of MFU.

These run the model once, eagerly, under FlopCounterMode, so they belong at setup time (before
the first step), never inside the training loop. Counts are exact for the ops PyTorch has
formulas for (matmuls, convolutions, attention); elementwise ops count as 0, which is the
usual MFU convention.

Note: the count is what actually runs. For the first layer, whose input needs no gradient,
autograd skips the input-gradient matmul, so a Linear costs 2mnk forward + 2mnk backward
(weight grad only) = 4mnk rather than the textbook 6mnk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from trainspeed.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["count_flops", "count_train_step_flops", "flop_counter", "missing_formulas"]


def count_flops(fn: Callable[[], Any]) -> int:
    """Total FLOPs of the torch ops `fn()` runs (forward and, if it calls it, backward)."""
    counter = flop_counter()
    with counter:
        fn()
    return int(counter.get_total_flops())


def flop_counter() -> Any:
    """A FlopCounterMode (not displayed) that also counts the ops in missing_formulas()."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping=missing_formulas())


def missing_formulas() -> dict[Any, Callable[..., int]]:
    """Formulas for ops that this torch's FlopCounterMode counts as 0 FLOPs although they
    compute: on the CPU, `scaled_dot_product_attention` runs
    `_scaled_dot_product_flash_attention_for_cpu` (and its backward), which torch 2.13 has no
    formula for (pytorch/pytorch#195460), so a transformer's attention matmuls vanished from
    MFU on CPU. They get the formulas torch uses for the GPU kernels (full, not causal-halved,
    attention: the usual convention). The fused recurrent kernels count 0 as well: an `nn.LSTM` on
    the CPU runs `mkldnn_rnn_layer` (one layer, one direction a call), on CUDA `_cudnn_rnn`
    (ROCm: `miopen_rnn`), so an LSTM model's MFU read "0.0% of the peak" (pytorch/examples'
    mnist_rnn). They get the matmuls they run: 2 FLOPs per token per weight of the input and
    hidden matrices, the backward twice that. An op a later torch knows is left to torch."""
    import torch
    from torch.utils import flop_counter

    aten = torch.ops.aten
    formulas = {
        "_scaled_dot_product_flash_attention_for_cpu": _sdpa_forward,
        "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_backward,
        "mkldnn_rnn_layer": _mkldnn_rnn_forward,
        "mkldnn_rnn_layer_backward": _mkldnn_rnn_backward,
        "_cudnn_rnn": _fused_rnn_forward,
        "_cudnn_rnn_backward": _fused_rnn_backward,
        "miopen_rnn": _fused_rnn_forward,
        "miopen_rnn_backward": _fused_rnn_backward,
    }
    out = {}
    for name, formula in formulas.items():
        op = getattr(aten, name, None)
        if op is not None and op not in flop_counter.flop_registry:
            out[op] = formula
    return out


def _sdpa_forward(query_shape, key_shape, value_shape, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_backward(grad_out_shape, query_shape, key_shape, value_shape, *args: Any, out_shape: Any = None,
                   **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _rnn_flops(input_shape: Any, weight_shapes: Any) -> int:
    """Forward FLOPs of a recurrent layer: each token (time step x batch row; a packed input's
    rows) multiplies every 2-D weight (input-hidden, hidden-hidden, projection) once."""
    tokens = 1
    for size in tuple(input_shape)[:-1]:
        tokens *= int(size)
    return 2 * tokens * sum(int(w[0]) * int(w[1]) for w in weight_shapes if w is not None and len(w) == 2)


def _mkldnn_rnn_forward(input_shape, w_ih, w_hh, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return _rnn_flops(input_shape, (w_ih, w_hh))


def _mkldnn_rnn_backward(input_shape, w_ih, w_hh, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    # The gradients of the inputs (hidden state included) and of the weights: twice the forward.
    return 2 * _rnn_flops(input_shape, (w_ih, w_hh))


def _fused_rnn_forward(input_shape, weights, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    # Every layer and direction runs over all tokens; its 2-D weights name its own input width.
    return _rnn_flops(input_shape, weights)


def _fused_rnn_backward(input_shape, weights, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return 2 * _rnn_flops(input_shape, weights)


def count_train_step_flops(
    model: "torch.nn.Module",
    loss_fn: Callable[["torch.nn.Module", Any], "torch.Tensor"],
    batch: Any,
) -> int:
    """FLOPs of one training step's forward + backward, leaving the model as it was.

    `loss_fn(model, batch)` must return the scalar loss (it does the forward pass and the loss).
    The optimizer step is not counted (its FLOPs are O(params), negligible against the matmuls).
    Afterwards every parameter's `.grad` is restored to what it was (None stays None), buffers
    (e.g. BatchNorm running stats) are restored, and the RNG state is put back so dropout masks
    of the real run do not shift.
    """
    import torch

    params = [p for p in model.parameters()]
    saved_grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
    saved_buffers = [(b, b.detach().clone()) for b in model.buffers()]
    cpu_rng = torch.get_rng_state()
    cuda_devices = sorted({p.device.index or 0 for p in params if p.device.type == "cuda"})
    # get_rng_state on CUDA copies the state to the host: a sync, acceptable at setup time.
    cuda_rng = [(d, torch.cuda.get_rng_state(d)) for d in cuda_devices]

    def step() -> None:
        loss = loss_fn(model, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ConfigError(
                "count_train_step_flops: loss_fn(model, batch) must return a scalar loss tensor; "
                f"got {type(loss).__name__}{'' if not isinstance(loss, torch.Tensor) else ' of shape ' + str(tuple(loss.shape))}"
            )
        if not loss.requires_grad:
            raise ConfigError(
                "count_train_step_flops: the loss does not require grad (no trainable parameters, "
                "or loss_fn ran under torch.no_grad()); cannot count the backward pass"
            )
        loss.backward()

    try:
        return count_flops(step)
    finally:
        with torch.no_grad():
            for p, g in zip(params, saved_grads):
                p.grad = g
            for buf, value in saved_buffers:
                buf.copy_(value)
        torch.set_rng_state(cpu_rng)
        for d, state in cuda_rng:
            torch.cuda.set_rng_state(state, d)
