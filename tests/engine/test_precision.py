from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainspeed.config import PrecisionConfig
from trainspeed.engine.precision import cpu_flags, setup_precision
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

NATIVE = {"avx512f", "avx512_bf16", "amx_bf16"}


def _cfg(mode, grad_scaler="auto", init_scale=2.0**16):
    return SimpleNamespace(mode=mode, grad_scaler=grad_scaler, init_scale=init_scale)


def test_fp32_is_a_no_op():
    prec = setup_precision(PrecisionConfig(), "cpu", flags=NATIVE)
    assert prec.dtype is None and prec.scaler is None and prec.notes == []
    lin = nn.Linear(4, 4)
    with prec.autocast():
        assert lin(torch.randn(2, 4)).dtype == torch.float32


def test_fp16_without_scaler_is_refused():
    with pytest.raises(ConfigError) as info:
        setup_precision(_cfg("fp16-mixed", grad_scaler=False), "cpu", flags=NATIVE)
    text = str(info.value)
    assert "precision.grad_scaler=false" in text and "underflow" in text and "bf16-mixed" in text


def test_bad_mode_and_init_scale():
    with pytest.raises(ConfigError, match="precision.mode"):
        setup_precision(_cfg("int8"), "cpu")
    with pytest.raises(ConfigError, match="init_scale"):
        setup_precision(_cfg("fp16-mixed", init_scale=0.0), "cpu")


def test_bf16_autocast_on_cpu_gives_bf16_matmuls():
    prec = setup_precision(PrecisionConfig(mode="bf16-mixed"), "cpu", flags=NATIVE)
    assert prec.dtype is torch.bfloat16 and prec.scaler is None
    lin = nn.Linear(8, 8)
    x = torch.randn(3, 8)
    with prec.autocast():
        out = lin(x)
        mm = x @ lin.weight.t()
    assert out.dtype == torch.bfloat16 and mm.dtype == torch.bfloat16
    assert lin(x).dtype == torch.float32  # only inside the region
    assert any("native bf16" in n for n in prec.notes)


def test_bf16_on_cpu_without_units_says_it_will_be_slow():
    prec = setup_precision(PrecisionConfig(mode="bf16-mixed"), "cpu", flags={"avx2", "fma"})
    assert len(prec.notes) == 1 and "slower than fp32" in prec.notes[0]


def test_fp16_on_cpu_allowed_with_note_and_scaler():
    prec = setup_precision(PrecisionConfig(mode="fp16-mixed"), "cpu", flags={"avx2"})
    assert prec.dtype is torch.float16
    assert isinstance(prec.scaler, torch.amp.GradScaler)
    assert prec.scaler.get_scale() == 65536.0
    assert any("fp16-mixed on CPU" in n for n in prec.notes)


def test_cpu_flags_reader(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert cpu_flags(info) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(tmp_path / "missing") is None
    prec = setup_precision(PrecisionConfig(mode="bf16-mixed"), "cpu", flags=cpu_flags(info))
    assert "amx_bf16" in prec.notes[0]


def _scaled_step(prec, model, opt, poison: bool):
    x = torch.randn(4, 3)
    with prec.autocast():
        loss = model(x).float().pow(2).mean()
    prec.backward(loss)
    if poison:
        model.weight.grad[0, 0] = float("inf")
    return prec.step(opt)


@pytest.mark.parametrize("kernel", [{"foreach": False}, {"fused": True}])  # fused: inf check in-kernel
def test_grad_scaler_detects_skipped_step(kernel):
    torch.manual_seed(0)
    prec = setup_precision(PrecisionConfig(mode="fp16-mixed", init_scale=1024.0), "cpu", flags={"avx2"})
    model = nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, **kernel)

    before = model.weight.detach().clone()
    skipped = _scaled_step(prec, model, opt, poison=True)
    assert isinstance(skipped, torch.Tensor) and bool(skipped) is True
    assert torch.equal(model.weight, before)  # the step really was skipped
    assert prec.scaler.get_scale() == 512.0
    opt.zero_grad()

    skipped = _scaled_step(prec, model, opt, poison=False)
    assert bool(skipped) is False
    assert not torch.equal(model.weight, before)
    assert prec.skipped_total() == 1
    assert prec.state_dict()["scaler"]["scale"] == 512.0


def test_unscale_gives_true_gradients_for_clipping():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    ref = nn.Linear(3, 1)
    ref.load_state_dict(model.state_dict())
    x = torch.randn(5, 3)
    ref(x).pow(2).mean().backward()

    prec = setup_precision(_cfg("bf16-mixed", grad_scaler=True, init_scale=256.0), "cpu", flags=NATIVE)
    assert any("only" in n and "fp16" in n for n in prec.notes)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prec.backward(model(x).pow(2).mean())  # fp32 forward, scaled backward
    torch.testing.assert_close(model.weight.grad, ref.weight.grad * 256.0)
    prec.unscale_(opt)
    torch.testing.assert_close(model.weight.grad, ref.weight.grad)


def test_no_scaler_step_returns_false():
    prec = setup_precision(PrecisionConfig(mode="bf16-mixed"), "cpu", flags=NATIVE)
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=1.0)
    prec.backward(p.sum())
    assert prec.step(opt) is False
    assert p.tolist() == [0.0, 0.0]
    assert prec.skipped_total() == 0 and prec.state_dict() == {}


def test_tf32_sets_and_restores_global_flags():
    old = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
           torch.backends.cudnn.allow_tf32)
    try:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        prec = setup_precision(PrecisionConfig(mode="tf32"), "cpu", flags=NATIVE)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "high"
        assert any("CUDA matmuls only" in n for n in prec.notes)
        prec.restore()
        prec.restore()  # idempotent
        assert torch.get_float32_matmul_precision() == "highest"
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.set_float32_matmul_precision(old[0])
        torch.backends.cuda.matmul.allow_tf32 = old[1]
        torch.backends.cudnn.allow_tf32 = old[2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp16_cuda_step_runs():
    prec = setup_precision(PrecisionConfig(mode="fp16-mixed"), "cuda")
    model = nn.Linear(8, 8).cuda()
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    with prec.autocast():
        out = model(torch.randn(4, 8, device="cuda"))
    assert out.dtype == torch.float16
    prec.backward(out.float().pow(2).mean())
    assert bool(prec.step(opt)) is False
