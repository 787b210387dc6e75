from __future__ import annotations

import copy
import shutil
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainspeed.config import CompileConfig
from trainspeed.engine.compile import EagerFallback, apply_compile
from trainspeed.engine.optim import build_optimizer
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(120)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.BatchNorm1d(8), nn.Linear(8, 2))


class Boom(RuntimeError):
    pass


def _failing_compiler(calls):
    def compiler(model, **kwargs):
        calls.append(kwargs)

        def compiled(*args, **kw):
            raise Boom("inductor: C++ compiler not found")
        return compiled
    return compiler


def test_off_returns_the_model_unchanged():
    model = _mlp()
    result = apply_compile(model, CompileConfig())
    assert result.module is model and not result.enabled and result.mode == "off"


def test_failing_compile_falls_back_to_eager_result():
    model = _mlp()
    calls = []
    result = apply_compile(model, CompileConfig(mode="max-autotune", dynamic=False),
                           compiler=_failing_compiler(calls))
    assert calls == [{"mode": "max-autotune", "fullgraph": False, "dynamic": False}]
    wrapped = result.module
    assert result.enabled and isinstance(wrapped, EagerFallback) and wrapped.fallback_reason is None
    x = torch.randn(5, 4)
    model.eval()
    expected = model(x)
    out = wrapped.eval()(x)
    torch.testing.assert_close(out, expected)
    assert not wrapped.is_compiled
    assert "Boom" in wrapped.fallback_reason and "C++ compiler not found" in wrapped.fallback_reason
    assert "eager" in wrapped.fallback_reason
    torch.testing.assert_close(wrapped(x), expected)  # stays eager


def test_no_fallback_reraises():
    result = apply_compile(_mlp(), CompileConfig(mode="default", fallback_to_eager=False),
                           compiler=_failing_compiler([]))
    with pytest.raises(Boom):
        result.module(torch.randn(3, 4))
    assert result.module.is_compiled


def test_errors_that_eager_raises_too_are_not_compile_failures():
    result = apply_compile(_mlp(), CompileConfig(mode="default"), compiler=_failing_compiler([]))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        result.module(torch.randn(3, 5))  # wrong input width: eager fails as well
    assert result.module.is_compiled and result.module.fallback_reason is None


def test_oom_is_not_swallowed():
    def compiler(model, **kwargs):
        def compiled(*args, **kw):
            raise torch.OutOfMemoryError("CUDA out of memory")
        return compiled
    result = apply_compile(_mlp(), CompileConfig(mode="default"), compiler=compiler)
    with pytest.raises(torch.OutOfMemoryError):
        result.module(torch.randn(3, 4))
    assert result.module.fallback_reason is None


def test_setup_failure_falls_back_with_note():
    def compiler(model, **kwargs):
        raise RuntimeError("backend not available")
    model = _mlp()
    result = apply_compile(model, CompileConfig(mode="default"), compiler=compiler)
    assert result.module is model and not result.enabled
    assert "backend not available" in result.notes[0]


def test_state_dict_keys_match_eager_both_ways():
    model = _mlp()
    wrapped = EagerFallback(model, torch.compile(model))  # lazy: nothing compiles here
    assert list(wrapped.state_dict().keys()) == list(model.state_dict().keys())
    other = _mlp()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    wrapped.load_state_dict(other.state_dict())
    torch.testing.assert_close(model[0].weight, other[0].weight)
    # nested inside another module: keys read as if the eager model were there
    parent, plain = nn.ModuleDict({"net": wrapped}), nn.ModuleDict({"net": _mlp()})
    assert list(parent.state_dict().keys()) == list(plain.state_dict().keys())
    plain.load_state_dict(parent.state_dict())
    parent.load_state_dict(plain.state_dict())  # strict: would fail on any prefix mismatch
    # optimizer over the wrapper sees the eager parameters once
    _, info = build_optimizer(wrapped, SimpleNamespace(name="sgd", lr=0.1, implementation="loop"), "cpu")
    assert info["decay_tensors"] + info["no_decay_tensors"] == len(list(model.parameters()))


def test_train_eval_reach_the_eager_module():
    model = _mlp()
    wrapped = EagerFallback(model, torch.compile(model))
    wrapped.eval()
    assert not model.training and not model[2].training and not wrapped.compiled.training
    wrapped.train()
    assert model.training and wrapped.compiled.training


def test_invalid_mode():
    with pytest.raises(ConfigError, match="compile.mode"):
        apply_compile(_mlp(), SimpleNamespace(mode="fast"))


def _have_toolchain():
    import torch._dynamo
    return torch._dynamo.is_dynamo_supported() and any(shutil.which(c) for c in ("g++", "c++", "clang++"))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not _have_toolchain(),
                    reason="torch.compile/inductor needs dynamo support and a C++ compiler")
def test_real_compile_matches_eager_on_cpu():
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 3))
    reference = copy.deepcopy(model)
    result = apply_compile(model, CompileConfig(mode="default", fallback_to_eager=False))
    x = torch.randn(6, 4)
    out = result.module(x)
    assert result.module.fallback_reason is None and result.module.compiled_calls == 1
    assert result.module.first_call_seconds is not None and result.module.first_call_seconds > 0
    torch.testing.assert_close(out, reference(x), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    reference(x).sum().backward()
    torch.testing.assert_close(model[0].weight.grad, reference[0].weight.grad, rtol=1e-5, atol=1e-5)
