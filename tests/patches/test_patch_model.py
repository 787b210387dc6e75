"""Settings on the trained module (precision, fp16's GradScaler, channels_last) and on a
Hugging Face model's attention; constructor sites reached through user subclasses."""

from __future__ import annotations

import pytest
import torch

from trainspeed.patches.targets import Targets

pytestmark = pytest.mark.timeout(120)

NET = """
import torch
from torch import nn

SEEN, GRADS = [], []


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        SEEN.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return self.lin(x)


model = Net()
teacher = Net().requires_grad_(False)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
before = model.lin.weight.detach().clone()
for step in range(4):
    x = torch.randn(4, 8)
    with torch.no_grad():
        target = teacher(x)
    out = model(x)  # CALL
    loss = (out.float() - target).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    GRADS.append(model.lin.weight.grad.abs().sum().item())
    opt.step()
CHANGED = not torch.equal(before, model.lin.weight)
"""


def test_bf16_autocasts_the_trained_module_not_the_frozen_teacher(script):
    g, notes = script(NET).run({"precision": "bf16"})
    # calls: teacher, model, teacher, model...; the teacher (no grad) is never wrapped
    teacher_calls, model_calls = g["SEEN"][0::2], g["SEEN"][1::2]
    assert teacher_calls == [None] * 4
    assert model_calls == [torch.bfloat16] * 4  # the first call (that found it) too
    assert g["CHANGED"] and any("Net.forward runs under torch.autocast" in n for n in notes), notes
    assert "forward" not in g["model"].__dict__  # uninstalled


def test_model_class_target_picks_the_named_class(script):
    source = NET.replace("teacher = Net().requires_grad_(False)", "teacher = nn.Linear(8, 8)")
    g, notes = script(source).run({"precision": "bf16"}, Targets(model_class="Net"))
    assert g["SEEN"] == [torch.bfloat16] * 4  # the Linear teacher (trainable, called first) was passed over


def test_fp16_routes_the_step_through_a_grad_scaler(script, monkeypatch):
    calls = {"step": 0, "update": 0, "scales": []}
    step, update = torch.amp.GradScaler.step, torch.amp.GradScaler.update

    def spy_step(self, *args, **kwargs):
        calls["step"] += 1
        calls["scales"].append(self.get_scale())
        return step(self, *args, **kwargs)

    def spy_update(self, *args, **kwargs):
        calls["update"] += 1
        return update(self, *args, **kwargs)

    monkeypatch.setattr(torch.amp.GradScaler, "step", spy_step)
    monkeypatch.setattr(torch.amp.GradScaler, "update", spy_update)
    g, notes = script(NET).run({"precision": "fp16"})
    assert g["CHANGED"] and g["SEEN"][1::2] == [torch.float16] * 4
    assert calls["step"] == 4 and calls["update"] == 4 and calls["scales"][0] == 65536.0
    assert min(g["GRADS"]) > 100  # the script sees scaled gradients (the clipping hazard)
    assert any("gradient clipping" in n for n in notes)


def test_a_script_with_its_own_autocast_gets_neither_autocast_nor_scaler(script, monkeypatch):
    source = NET.replace("    out = model(x)  # CALL", "    with torch.autocast('cpu', dtype=torch.bfloat16):\n"
                                                     "        out = model(x)  # CALL")
    scaled = []
    monkeypatch.setattr(torch.amp.GradScaler, "scale", lambda self, t: scaled.append(1) or t)
    g, notes = script(source).run({"precision": "fp16"})
    assert g["SEEN"][1::2] == [torch.bfloat16] * 4 and not scaled
    assert any("already autocasts Net's forward (bfloat16)" in n and "no GradScaler" in n for n in notes), notes


def test_channels_last_converts_the_trained_conv_net_and_its_inputs(script):
    source = """
import torch
from torch import nn

LAYOUT = []


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        LAYOUT.append(x.is_contiguous(memory_format=torch.channels_last))
        return self.head(self.conv(x).mean((2, 3)))


model = Conv()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(2, 3, 8, 8)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
    g, notes = script(source).run({"channels_last": True})
    assert g["model"].conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert g["LAYOUT"][1:] == [True, True]
    assert not g["model"]._forward_pre_hooks  # uninstalled


HF = """
import torch
import transformers

def config():  # one each: a model keeps (and transformers mutates) the config it was given
    return transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=32)


auto = transformers.AutoModelForCausalLM.from_config(config())
own = transformers.AutoModelForCausalLM.from_config(config(), attn_implementation="sdpa")
direct = transformers.GPT2LMHeadModel(config())
trained = own if TRAIN_OWN else direct
opt = torch.optim.AdamW(trained.parameters(), lr=1e-3)
ids = torch.randint(0, 50, (2, 8))
for _ in range(2):
    loss = trained(input_ids=ids, labels=ids).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_attn_implementation_from_config_user_value_and_direct_construction(script):
    transformers = pytest.importorskip("transformers")
    base = transformers.PreTrainedModel.__dict__["_from_config"]
    g, notes = script(HF).run({"hf.attn_implementation": "eager"}, TRAIN_OWN=False)
    assert g["auto"].config._attn_implementation == "eager"
    assert g["own"].config._attn_implementation == "sdpa"  # the script's own choice wins
    assert any("'sdpa'; kept over 'eager'" in n for n in notes), notes
    # built from its class: switched once it was found training (GPT-2's default is sdpa)
    assert g["direct"].config._attn_implementation == "eager"
    assert any("GPT2LMHeadModel.set_attn_implementation('eager')" in n for n in notes), notes
    assert transformers.PreTrainedModel.__dict__["_from_config"] is base
    # the script's own choice stays when that model is the one trained
    g, notes = script(HF).run({"hf.attn_implementation": "eager"}, TRAIN_OWN=True)
    assert g["own"].config._attn_implementation == "sdpa"


def test_flash_attention_without_the_package_is_a_failed_note(script):
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed")
    g, notes = script("x = 1\n").run({"hf.attn_implementation": "flash_attention_2"})
    assert notes and notes[0].startswith("failed:") and "flash_attn" in notes[0]


SUBCLASSES = """
import torch
from torch.utils.data import DataLoader, TensorDataset


class MyLoader(DataLoader):
    def __init__(self, ds, **kw):
        super().__init__(ds, batch_size=4, **kw)


class MyAdam(torch.optim.AdamW):
    def __init__(self, params):
        super().__init__(params, lr=1e-3)


ds = TensorDataset(torch.randn(16, 2))
train = MyLoader(ds)  # TRAIN
model = torch.nn.Linear(2, 2)
opt = MyAdam(p for p in model.parameters())  # OPT
loss = model(torch.randn(3, 2)).sum()
loss.backward()
opt.step()
"""


def test_sites_are_matched_through_user_subclasses(script):
    s = script(SUBCLASSES)
    g, notes = s.run({"loader.num_workers": 1, "optimizer.impl": "fused"},
                     Targets(loader_site=s.site("# TRAIN"), optimizer_site=s.site("# OPT")))
    assert g["train"].num_workers == 1
    assert g["opt"].defaults["fused"] is True and len(g["opt"].param_groups[0]["params"]) == 2


COMPILE = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))  # all torch's own forwards
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_compile_that_fails_runs_eager_with_a_failed_note(script, monkeypatch):
    import torch._inductor.compile_fx as compile_fx

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(compile_fx, "compile_fx", broken)
    g, notes = script(COMPILE).run({"compile": "default"})
    assert any(n.startswith("failed: torch.compile fell back to eager") and "no C++ compiler" in n
               for n in notes), notes
    assert torch._dynamo.config.suppress_errors is False and g["model"]._compiled_call_impl is None


def test_a_script_that_compiles_is_not_compiled_again(script):
    g, notes = script(COMPILE).run({"compile": "default"}, Targets(compiled=True))
    assert notes == ["compile: the script already compiles its model; not compiled again"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compile_really_compiles_a_torch_only_module(script, monkeypatch):
    # nn.Sequential's forward is torch's own code, which dynamo skips under module.compile()
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = []
    original = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn) or original(fn, **kw))
    g, notes = script(COMPILE).run({"compile": "default"})
    # what nn.Module.compile() does: the module's own _call_impl compiled, in place
    assert [type(fn.__self__).__name__ for fn in compiled] == ["Sequential"]
    assert counters["frames"]["ok"] >= 1, (dict(counters["frames"]), notes)
    assert notes == ["compile: Sequential compiled in place (mode default)"]


def test_fp16_leaves_an_optimizer_without_gradients_alone(script):
    # GradScaler.step asserts when it unscaled nothing: an optimizer over parameters that got
    # no gradient this step (a second model trained every other step) must still step
    source = NET.replace("    opt.step()\n", "    opt.step()\n    idle.step()\n").replace(
        "opt = torch.optim.SGD(", "idle = torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=0.1)\nopt = torch.optim.SGD(")
    g, notes = script(source).run({"precision": "fp16"})
    assert g["CHANGED"]


def test_a_model_setting_that_never_found_its_module_says_so(script):
    source = "import torch\nmodel = torch.nn.Linear(2, 2).eval()\nwith torch.no_grad():\n    model(torch.randn(1, 2))\n"
    g, notes = script(source).run({"precision": "bf16", "channels_last": True})
    assert notes == ["failed: precision=bf16, channels_last: no trained module was called (train mode, grad "
                     "enabled, trainable parameters); not applied"]


def test_a_failing_action_is_a_note_not_a_crash(script, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise RuntimeError("cannot convert")

    source = "import torch\nmodel = torch.nn.Linear(2, 2)\nout = model(torch.randn(1, 2))\n"
    monkeypatch.setattr(torch.nn.Linear, "to", refuse, raising=False)
    g, notes = script(source).run({"channels_last": True})
    assert g["out"].shape == (1, 2)
    assert notes == ["failed: channels_last on Linear: RuntimeError: cannot convert"]
