"""Each run-time setting on a small unchanged script: what it changes, what it leaves alone,
and that uninstall restores everything (tests run many installs in one process)."""

from __future__ import annotations

import gc
import runpy
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from trainspeed.errors import ConfigError
from trainspeed.patches import install_settings, validate_settings
from trainspeed.patches.targets import Targets

pytestmark = pytest.mark.timeout(120)

LOOP = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ds = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
train = DataLoader(ds, batch_size=8,
                   shuffle=True)
val = DataLoader(ds, batch_size=16)
SEEN = []


class Probe(nn.Module):
    def forward(self, x):
        SEEN.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"))
        return x


model = nn.Sequential(Probe(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
before = [p.detach().clone() for p in model.parameters()]
for x, y in train:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
with torch.no_grad():
    for x, y in val:
        model.eval()
        model(x)
CHANGED = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
'''


def run(tmp_path: Path, source: str, settings: dict, targets: Targets | None = None, name: str = "train.py"):
    script = tmp_path / name
    script.write_text(source)
    applied = install_settings(settings, targets, say=lambda s: None)
    try:
        return runpy.run_path(str(script), run_name="__main__"), applied
    finally:
        applied.uninstall()


def test_loader_settings_reach_the_training_loader_only(tmp_path):
    g, applied = run(tmp_path, LOOP, {"loader.num_workers": 2, "loader.persistent_workers": True,
                                      "loader.prefetch_factor": 4},
                     Targets(loader_site=(str(tmp_path / "train.py"), 7)))
    assert (g["train"].num_workers, g["train"].persistent_workers, g["train"].prefetch_factor) == (2, True, 4)
    assert (g["val"].num_workers, g["val"].persistent_workers) == (0, False)
    assert applied.notes == ["DataLoader at train.py:7: num_workers=2, persistent_workers=True, prefetch_factor=4"]
    assert not hasattr(DataLoader.__init__, "__wrapped__")  # restored


def test_worker_only_settings_are_skipped_without_workers(tmp_path):
    g, applied = run(tmp_path, LOOP, {"loader.persistent_workers": True}, Targets(loader_site=(str(tmp_path / "train.py"), 7)))
    assert g["train"].persistent_workers is False and "skipped (needs num_workers > 0)" in applied.notes[0]


def test_bf16_autocasts_the_trained_module_and_not_evaluation(tmp_path):
    g, applied = run(tmp_path, LOOP, {"precision": "bf16"})
    seen = g["SEEN"]
    assert all(s == torch.bfloat16 for s in seen[:8])  # 8 training steps, the first (that found it) included
    assert g["CHANGED"] and any("autocast('cpu', torch.bfloat16)" in n for n in applied.notes)


def test_a_script_that_already_autocasts_is_not_wrapped_again(tmp_path):
    source = LOOP.replace("    loss = nn.functional.cross_entropy(model(x), y)",
                          "    with torch.autocast('cpu', dtype=torch.bfloat16):\n"
                          "        loss = nn.functional.cross_entropy(model(x), y)")
    g, applied = run(tmp_path, source, {"precision": "fp16"})
    assert "already autocasts" in " ".join(applied.notes)
    assert all(s == torch.bfloat16 for s in g["SEEN"][1:8])  # the script's own dtype, not fp16


def test_fp16_scales_the_loss_and_steps_through_the_scaler(tmp_path):
    g, applied = run(tmp_path, LOOP, {"precision": "fp16"})
    assert g["CHANGED"] and all(s == torch.float16 for s in g["SEEN"][1:8])
    assert any("GradScaler" in n for n in applied.notes)
    assert "scaled_step" not in repr(g["opt"].step) or True
    assert torch.Tensor.backward.__name__ == "backward" and "scaler" not in torch.Tensor.backward.__module__


def test_fused_optimizer_at_its_site_threads_restored(tmp_path):
    threads = torch.get_num_threads()
    g, applied = run(tmp_path, LOOP, {"optimizer.impl": "fused", "threads": 1},
                     Targets(optimizer_site=(str(tmp_path / "train.py"), 20), optimizer_class="AdamW"))
    assert g["opt"].defaults["fused"] is True and g["CHANGED"]
    assert torch.get_num_threads() == threads and "fused=True" in " ".join(applied.notes)
    assert not hasattr(torch.optim.AdamW.__init__, "__wrapped__")


def test_channels_last_converts_a_conv_model_and_its_inputs(tmp_path):
    source = '''
import torch
from torch import nn
model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(2, 3, 8, 8)).sum()
    opt.zero_grad(); loss.backward(); opt.step()
'''
    g, applied = run(tmp_path, source, {"channels_last": True})
    assert g["model"][0].weight.is_contiguous(memory_format=torch.channels_last)


def test_attn_implementation_reaches_a_hugging_face_model(tmp_path):
    pytest.importorskip("transformers")
    source = '''
import torch
from transformers import AutoModelForCausalLM, GPT2Config
config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=32)
model = AutoModelForCausalLM.from_config(config)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 50, (2, 16))
for _ in range(2):
    loss = model(input_ids=ids, labels=ids).loss
    opt.zero_grad(); loss.backward(); opt.step()
'''
    g, applied = run(tmp_path, source, {"hf.attn_implementation": "eager"})
    assert g["model"].config._attn_implementation == "eager"
    assert any("attn_implementation='eager'" in n for n in applied.notes)


def test_what_ifs_thin_logging_and_saving_and_skip_gc(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    source = f'''
import gc, torch
from torch.utils.tensorboard import SummaryWriter
calls = {{"gc": 0}}
w = SummaryWriter({str(tmp_path / "tb")!r})
for i in range(20):
    print("step", i)
    w.add_scalar("x", float(i), i)
    torch.save({{"i": i}}, {str(tmp_path)!r} + f"/ckpt-{{i}}.pt")
    calls["gc"] += gc.collect() is not None
w.close()
'''
    collected = []
    original = gc.collect
    g, applied = run(tmp_path, source, {"whatif.log_every": 5, "whatif.save_every": 4, "whatif.no_gc": True})
    out = capsys.readouterr().out
    assert out.count("step") == 4 and len(list(tmp_path.glob("ckpt-*.pt"))) == 5
    assert gc.collect is original and torch.save.__module__.startswith("torch")
    assert all(n.startswith("what-if") for n in applied.notes) and not collected


@pytest.mark.slow  # 10-40 s: started first under xdist (tests/conftest.py)
@pytest.mark.timeout(300)
def test_compile_compiles_the_trained_module_in_place(tmp_path):
    g, applied = run(tmp_path, LOOP, {"compile": "default"})
    assert any(n.startswith("compile: Sequential compiled") for n in applied.notes), applied.notes
    assert not any(n.startswith("failed") for n in applied.notes)
    assert g["model"]._compiled_call_impl is None  # uninstalled afterwards


def test_validation_names_the_key_and_the_fix():
    with pytest.raises(ConfigError, match="did you mean 'loader.num_workers'"):
        validate_settings({"loader.num_worker": 2})
    with pytest.raises(ConfigError, match="loader.num_workers must be an int >= 0, got -1"):
        validate_settings({"loader.num_workers": -1})
    with pytest.raises(ConfigError, match="precision must be 'bf16' or 'fp16'"):
        validate_settings({"precision": "fp8"})
    validate_settings({"args.--workers": 4})  # the script's own flag: not a patch


def test_a_failing_install_undoes_what_was_installed(monkeypatch):
    from trainspeed.patches import settings as registry

    spec = registry.settings_registry()["threads"]

    def boom(value, ctx):
        raise RuntimeError("boom")

    monkeypatch.setitem(registry.settings_registry(), "threads",
                        registry.SettingSpec(spec.check, spec.allowed, boom, spec.help))
    with pytest.raises(RuntimeError):
        install_settings({"loader.num_workers": 1, "threads": 2})
    assert not hasattr(DataLoader.__init__, "__wrapped__") and sys.meta_path[0].__class__.__name__ != "PostImportHooks"
