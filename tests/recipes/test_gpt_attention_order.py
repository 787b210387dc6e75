"""The gpt recipe's SDPA backend order: cuDNN first on Hopper GPUs only (auto), a choice the
options validate, and the same numbers whichever order the attention asks for."""
from __future__ import annotations

import pytest
import torch

from trainspeed.errors import ConfigError
from trainspeed.recipes.gpt.attention_order import sdpa_order
from trainspeed.recipes.gpt.model import GPT, GPTOptions

pytestmark = pytest.mark.timeout(120)


def test_auto_puts_cudnn_first_on_hopper_only():
    from torch.nn.attention import SDPBackend

    hopper = sdpa_order("auto", 9)
    assert hopper[0] == SDPBackend.CUDNN_ATTENTION and SDPBackend.FLASH_ATTENTION in hopper
    assert hopper[-1] == SDPBackend.MATH  # shapes no fused kernel serves still run
    assert sdpa_order("auto", 8) is None and sdpa_order("auto", 10) is None  # Ampere, Blackwell: torch's order
    assert sdpa_order("auto", None) is None and sdpa_order("cudnn", None) is None  # not CUDA
    assert sdpa_order("cudnn", 8)[0] == SDPBackend.CUDNN_ATTENTION
    assert sdpa_order("torch", 9) is None


def test_the_option_is_validated():
    with pytest.raises(ConfigError, match="attention"):
        GPTOptions(attention="fast")


def test_an_explicit_order_gives_the_same_loss_and_gradients():
    """On a CPU the priority list falls through to the backend that serves it: the order changes
    which kernel runs, never the numbers."""
    torch.manual_seed(0)
    model = GPT(GPTOptions(size="tiny", block_size=32))
    idx = torch.randint(0, 256, (2, 32))
    loss = model(idx, targets=idx)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.use_sdpa_order(sdpa_order("cudnn", 9))
    assert all(b.attn.sdpa_order is not None for b in model.h)
    again = model(idx, targets=idx)
    again.backward()
    assert torch.equal(loss, again)
    assert all(torch.allclose(g, p.grad) for g, p in zip(grads, model.parameters()))


def test_the_order_is_traced_in_one_graph():
    """torch.compile traces the sdpa_kernel context inside the attention (inductor fixes the
    backend at trace time): fullgraph=True fails on a graph break."""
    torch.manual_seed(0)
    model = GPT(GPTOptions(size="tiny", n_layer=1, block_size=16))
    model.use_sdpa_order(sdpa_order("cudnn", 9))
    idx = torch.randint(0, 256, (2, 16))
    eager = model(idx, targets=idx)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(idx, targets=idx)
    assert torch.allclose(eager, compiled, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_cudnn_order_trains_like_torchs_own():
    """On the GPU (make gpu-test): the same bf16 loss and gradients with cuDNN asked for first as
    with torch's own order, within bf16's rounding; on a Hopper GPU these are different kernels."""
    torch.manual_seed(0)
    model = GPT(GPTOptions(size="tiny", block_size=128)).cuda()
    idx = torch.randint(0, 256, (4, 128), device="cuda")
    runs = []
    for order in (None, sdpa_order("cudnn", 9)):
        model.use_sdpa_order(order)
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, targets=idx)
        loss.backward()
        runs.append((loss.detach().float(), [p.grad.detach().float().clone() for p in model.parameters()]))
    (l0, g0), (l1, g1) = runs
    assert torch.allclose(l0, l1, rtol=2e-2, atol=2e-2)
    assert all(torch.isfinite(g).all() for g in g1)
    assert all(torch.allclose(a, b, rtol=5e-2, atol=5e-3) for a, b in zip(g0, g1))
