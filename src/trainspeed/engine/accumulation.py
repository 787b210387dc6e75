"""Gradient accumulation math: how to weight k micro-batch losses, and how to split a batch.

Accumulating k micro-batches must give the gradient of the one big batch they came from.
With `normalize="mean"` each micro-batch loss (already a mean over its samples) is weighted
1/k, which is exact when the micro-batches are the same size. With `normalize="tokens"` each
micro-batch loss (a mean over its own tokens) is weighted tokens_i / sum(tokens), so the sum
is the mean over *all* tokens of the step, exactly as in one big batch:

    sum_i (t_i / T) * (1 / t_i) * sum_{tokens in i} l  =  (1 / T) * sum_{all tokens} l

Weighting every micro-batch by 1/k instead would over-weight the tokens of short micro-batches.
The weights need all k token counts before the first backward, so the caller looks ahead k
micro-batches (their host-side lengths are enough), or uses `rescale_grads_` afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch

from trainspeed.errors import ConfigError

__all__ = ["micro_batch_weights", "split_batch", "batch_size", "rescale_grads_", "combine_losses"]

Normalize = Literal["mean", "tokens"]


def micro_batch_weights(
    token_counts: Sequence[int | float | torch.Tensor], normalize: Normalize
) -> list[float] | torch.Tensor:
    """Loss weight of each of k micro-batches (the weights sum to 1).

    `token_counts` has one entry per micro-batch (for "mean" only its length matters).
    Python numbers give a list of floats. If any count is a tensor, the result is a 1-D
    float32 tensor on that tensor's device, computed without a CPU-GPU sync.
    """
    k = len(token_counts)
    if k < 1:
        raise ConfigError("micro_batch_weights needs at least one micro-batch, got an empty list")
    if normalize == "mean":
        return [1.0 / k] * k
    if normalize != "tokens":
        raise ConfigError(f"accumulation.normalize must be 'mean' or 'tokens', got {normalize!r}")
    tensors = [c for c in token_counts if isinstance(c, torch.Tensor)]
    if tensors:
        device = tensors[0].device
        counts = torch.stack([torch.as_tensor(c, dtype=torch.float32, device=device).reshape(())
                              for c in token_counts])
        # No validation here on purpose: checking for a zero total would be a host sync.
        return counts / counts.sum()
    counts = [float(c) for c in token_counts]
    if any(c < 0 for c in counts):
        raise ConfigError(f"token counts must be >= 0, got {list(token_counts)}")
    total = sum(counts)
    if total <= 0:
        raise ConfigError(
            f"accumulation.normalize='tokens' needs micro-batches that contain tokens, got token "
            f"counts {list(token_counts)}; use accumulation.normalize='mean' for this workload"
        )
    return [c / total for c in counts]


def combine_losses(losses: Sequence[torch.Tensor], weights: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """The step's loss from its micro-batch losses (detached, stays on the device)."""
    if len(losses) != len(weights):
        raise ConfigError(f"{len(losses)} losses but {len(weights)} weights")
    total = losses[0].detach().float() * weights[0]
    for loss, w in zip(losses[1:], weights[1:]):
        total = total + loss.detach().float() * w
    return total


@torch.no_grad()
def rescale_grads_(parameters: Any, factor: float | torch.Tensor) -> None:
    """Multiply every existing .grad by `factor` in place (e.g. 1 / total_tokens when the
    micro-batch losses were summed over tokens because the total was unknown in advance)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, factor)


def batch_size(batch: Any) -> int | None:
    """Size along dim 0 of the first tensor with at least one dimension (None: no such tensor)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() >= 1 else None
    if isinstance(batch, Mapping):
        items: Any = batch.values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return None
    for item in items:
        size = batch_size(item)
        if size is not None:
            return size
    return None


def split_batch(batch: Any, k: int) -> list[Any]:
    """Split a batch into k micro-batches along dim 0 (for accumulation and OOM recovery).

    Tensors with at least one dimension are split with `torch.tensor_split` (views, no copy;
    sizes differ by at most one when k does not divide the batch, so weight uneven parts by
    their sizes: `micro_batch_weights(sizes, "tokens")`). Dicts, lists, tuples and named
    tuples are split field by field and keep their type; 0-d tensors and other leaves
    (strings, numbers, None) are repeated in every micro-batch.
    """
    if not isinstance(k, int) or k < 1:
        raise ConfigError(f"split_batch: k must be an integer >= 1, got {k!r}")
    size = batch_size(batch)
    if size is None:
        raise ConfigError("split_batch: the batch holds no tensor with a batch dimension to split")
    if size < k:
        raise ConfigError(f"split_batch: cannot split a batch of {size} samples into {k} micro-batches")
    return [_take(batch, k, i, size) for i in range(k)]


def _take(obj: Any, k: int, i: int, size: int) -> Any:
    if isinstance(obj, torch.Tensor):
        if obj.dim() == 0:
            return obj
        if obj.shape[0] != size:
            raise ConfigError(
                f"split_batch: tensors disagree on the batch size ({obj.shape[0]} vs {size}); "
                "every tensor in a batch needs the samples along dim 0"
            )
        return torch.tensor_split(obj, k, dim=0)[i]
    if isinstance(obj, Mapping):
        parts = {key: _take(v, k, i, size) for key, v in obj.items()}
        if type(obj) is dict:
            return parts
        try:  # OrderedDict, UserDict-based batches (e.g. Hugging Face BatchEncoding)
            return type(obj)(parts)
        except TypeError:
            return parts
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # named tuple
        return type(obj)(*(_take(v, k, i, size) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_take(v, k, i, size) for v in obj)
    return obj
