from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainspeed.config import OptimConfig
from trainspeed.engine.optim import build_optimizer, param_groups, resolve_implementation, split_decay
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(60)


class RMSNorm(nn.Module):  # hand-written, as in many LLM codebases: found by its class name
    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.scale


class TinyLM(nn.Module):
    def __init__(self, vocab=11, dim=8, tie=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.ln = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = RMSNorm(dim)
        self.bn = nn.BatchNorm1d(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tie:
            self.head.weight = self.embed.weight
        self.frozen = nn.Linear(dim, dim)
        self.frozen.requires_grad_(False)


def _names(pairs):
    return {n for n, _ in pairs}


def test_decay_split_by_module_type():
    model = TinyLM(tie=False)
    decay, no_decay = split_decay(model)
    assert _names(decay) == {"proj.weight", "head.weight"}
    assert _names(no_decay) == {"embed.weight", "ln.weight", "ln.bias", "proj.bias", "norm.scale",
                                "bn.weight", "bn.bias"}


def test_tied_weight_counted_once_and_not_decayed():
    model = TinyLM(tie=True)
    decay, no_decay = split_decay(model)
    all_params = [p for _, p in decay + no_decay]
    assert len(all_params) == len({id(p) for p in all_params})
    assert _names(decay) == {"proj.weight"}
    assert "embed.weight" in _names(no_decay) and "head.weight" not in _names(no_decay)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for p in all_params} == trainable


def test_param_groups_weight_decay_values():
    model = TinyLM(tie=False)
    groups = param_groups(model, 0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert {id(p) for p in groups[0]["params"]} == {id(model.proj.weight), id(model.head.weight)}
    everything = param_groups(model, 0.1, decay_norm_and_bias=True)
    assert len(everything) == 1 and everything[0]["weight_decay"] == 0.1
    assert len(everything[0]["params"]) == sum(1 for p in model.parameters() if p.requires_grad)


def test_no_decay_params_really_are_not_decayed():
    model = TinyLM(tie=False)
    cfg = OptimConfig(lr=0.1, weight_decay=0.5, implementation="loop")
    opt, _ = build_optimizer(model, cfg, "cpu")
    ln_before = model.ln.weight.detach().clone()
    w_before = model.proj.weight.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # zero gradient: only weight decay moves a parameter
    opt.step()
    assert torch.equal(model.ln.weight, ln_before)
    torch.testing.assert_close(model.proj.weight, w_before * (1 - 0.1 * 0.5))


def test_implementation_choice_on_cpu():
    # PyTorch >= 2.4 has fused AdamW/SGD kernels for CPU; grouped foreach kernels are CUDA-only.
    assert resolve_implementation("auto", "cpu")[0] == "fused"
    assert resolve_implementation("loop", "cpu")[0] == "loop"
    impl, reason = resolve_implementation("foreach", "cpu")
    assert impl == "foreach" and "per-tensor fallback" in reason
    assert resolve_implementation("auto", "cuda")[0] == "fused"


@pytest.mark.parametrize("impl,flags", [("fused", {"fused": True}), ("foreach", {"foreach": True}),
                                        ("loop", {"foreach": False, "fused": False})])
@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_build_optimizer_sets_kernel_flags(name, impl, flags):
    model = TinyLM()
    cfg = OptimConfig(name=name, lr=0.01, implementation=impl, momentum=0.9)
    opt, info = build_optimizer(model, cfg, torch.device("cpu"))
    assert isinstance(opt, torch.optim.AdamW if name == "adamw" else torch.optim.SGD)
    assert info["implementation"] == impl and info["optimizer"] == name
    for key, value in flags.items():
        assert opt.defaults[key] is value
    assert info["decay_tensors"] == 1 and info["no_decay_tensors"] == 7
    model.proj(torch.randn(2, 8)).sum().backward()
    before = model.proj.weight.detach().clone()
    opt.step()
    assert not torch.equal(model.proj.weight, before)


def test_fused_is_refused_where_torch_has_no_kernels(monkeypatch):
    from torch.utils import _foreach_utils
    monkeypatch.setattr(_foreach_utils, "_get_fused_kernels_supported_devices", lambda: ["cuda"])
    with pytest.raises(ConfigError) as info:
        build_optimizer(TinyLM(), SimpleNamespace(name="adamw", implementation="fused", lr=1e-3,
                                                  weight_decay=0.0), "cpu")
    text = str(info.value)
    assert "'cpu'" in text and "'loop'" in text and "'auto'" in text
    opt, info2 = build_optimizer(TinyLM(), SimpleNamespace(name="adamw", implementation="auto", lr=1e-3,
                                                           weight_decay=0.0), "cpu")
    assert info2["implementation"] == "loop" and opt.defaults["fused"] in (False, None)


def test_bad_values():
    with pytest.raises(ConfigError, match="optim.implementation"):
        resolve_implementation("fast", "cpu")
    with pytest.raises(ConfigError, match="optim.name"):
        build_optimizer(TinyLM(), SimpleNamespace(name="lion", lr=1e-3), "cpu")
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ConfigError, match="no trainable"):
        param_groups(frozen, 0.1)


def test_wrappers_are_unwrapped():
    model = TinyLM(tie=False)

    class Wrapper(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.eager = inner

    decay, _ = split_decay(Wrapper(model))
    assert _names(decay) == {"proj.weight", "head.weight"}


def test_the_optimizer_note_says_what_was_chosen_and_where_decay_applies():
    from trainspeed.engine.optim import describe_optimizer

    model = TinyLM(tie=False)
    _, info = build_optimizer(model, OptimConfig(implementation="loop", weight_decay=0.1), torch.device("cpu"))
    text = describe_optimizer(info, names_shown=2)
    # decay: proj.weight (8x8) and head.weight (11x8); the other 7 tensors are norms, biases, embeddings
    assert text.startswith("optimizer: adamw, loop kernels; weight decay on 2 tensors (152 params), none on 7 (")
    assert text.endswith(f"params: {info['no_decay_names'][0]}, {info['no_decay_names'][1]}, +5 more)")
    auto = describe_optimizer(build_optimizer(model, OptimConfig(), torch.device("cpu"))[1])
    assert "kernels (auto: " in auto  # an automatic choice says why
