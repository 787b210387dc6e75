"""What-ifs (logging, checkpointing, gc thinned or removed) on a script, and the patches
installed under the doctor (a trial: the doctor is installed after them and wraps them)."""

from __future__ import annotations

import builtins
import gc
import sys

import pytest
import torch
from torch.utils.data import DataLoader

from trainspeed.patches import install_settings
from trainspeed.patches.targets import Targets

pytestmark = pytest.mark.timeout(120)

LOGGING = """
import gc
import torch
from torch.utils.tensorboard import SummaryWriter
import wandb

writer = SummaryWriter(OUT + "/tb")
for i in range(20):
    writer.add_scalar("loss", float(i), i)
    wandb.log({"loss": i}, commit=False)
    wandb.log({"lr": 0.1})
    torch.save({"i": i}, OUT + f"/ckpt-{i}.pt")
    print("step", i)
    gc.collect()
writer.close()
"""

FAKE_WANDB = """
CALLS = []


def log(data, step=None, commit=None):
    CALLS.append((dict(data), commit))
"""


def _scalars(tb_dir) -> int:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    count = 0
    for path in tb_dir.glob("events.out.tfevents.*"):
        for event in EventFileLoader(str(path)).Load():
            count += sum(1 for v in event.summary.value if v.tag == "loss")
    return count


def test_log_save_and_gc_what_ifs(script, tmp_path, capsys, monkeypatch):
    pytest.importorskip("tensorboard")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "wandb.py").write_text(FAKE_WANDB)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    # setitem first: teardown then restores sys.modules['wandb'] as it was (absent, or the real
    # package), so the fake imported below does not outlive this test
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.delitem(sys.modules, "wandb")
    collected = []
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or real_collect(*a))
    spy = gc.collect
    g, notes = script(LOGGING).run({"whatif.log_every": 5, "whatif.save_every": 5, "whatif.no_gc": True},
                                   OUT=str(tmp_path))
    assert _scalars(tmp_path / "tb") == 4
    calls = sys.modules["wandb"].CALLS
    assert len(calls) == 8 and [c for _, c in calls[:2]] == [False, None]  # commit passed through
    assert capsys.readouterr().out.count("step") == 4
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.pt")) == [f"ckpt-{i}.pt" for i in (0, 10, 15, 5)]
    assert not collected and gc.collect is spy
    assert all(n.startswith("what-if") for n in notes), notes
    assert torch.save.__module__ == "torch.serialization" and builtins.print.__module__ == "builtins"


def test_gc_every_runs_every_kth_gc_collect_of_the_script(script, tmp_path, monkeypatch):
    # what moving a per-step gc.collect() under `if i % 5 == 0:` does (whatif_code.py)
    ran = []
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: ran.append(1) or real_collect(*a))
    source = "import gc\nfor i in range(20):\n    gc.collect()\n"
    g, notes = script(source).run({"whatif.gc_every": 5}, OUT=str(tmp_path))
    assert len(ran) == 4 and notes == ["what-if: gc.collect and torch.cuda.empty_cache from the script run once "
                                       "every 5 calls per call site"]


def test_one_line_logging_many_tags_keeps_every_kth_step_of_each(script, tmp_path):
    pytest.importorskip("tensorboard")
    source = """
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter(OUT + "/tb")
for step in range(20):
    for name in ("a", "b", "c"):
        writer.add_scalar("loss", 1.0, step) if name == "a" else writer.add_scalar(name, 2.0, step)
writer.close()
"""
    script(source).run({"whatif.log_every": 5}, OUT=str(tmp_path))
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps: dict[str, list[int]] = {}
    for path in (tmp_path / "tb").glob("events.out.tfevents.*"):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                steps.setdefault(value.tag, []).append(event.step)
    assert steps == {"loss": [0, 5, 10, 15], "b": [0, 5, 10, 15], "c": [0, 5, 10, 15]}


def test_library_calls_are_not_thinned(tmp_path, monkeypatch):
    # an installed package's torch.save (a framework's checkpoint) and gc.collect still run
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "fakelib.py").write_text("import gc, torch\n"
                                     "def save(i, out):\n    torch.save(i, out)\n"
                                     "def collect():\n    return gc.collect()\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "fakelib", raising=False)
    import fakelib

    applied = install_settings({"whatif.save_every": 4, "whatif.no_gc": True}, say=lambda t: None)
    try:
        for i in range(8):
            fakelib.save(i, tmp_path / f"lib-{i}.pt")
        assert isinstance(fakelib.collect(), int)
    finally:
        applied.uninstall()
    assert len(list(tmp_path.glob("lib-*.pt"))) == 8


TRIAL = """
import torch
from torch.utils.data import DataLoader, TensorDataset

ds = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
train = DataLoader(ds, batch_size=8)  # TRAIN
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # OPT
for epoch in range(2):
    for x, y in train:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("loss", loss.item())
    torch.save(model.state_dict(), OUT + f"/epoch-{epoch}.pt")
"""


def test_patches_under_the_doctor(script, tmp_path):
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    s = script(TRIAL.replace("OUT +", repr(str(tmp_path)) + " +"))
    originals = (DataLoader.__dict__["__init__"], torch.optim.AdamW.__dict__["__init__"], builtins.print, torch.save)
    applied = install_settings({"loader.num_workers": 1, "optimizer.impl": "fused", "precision": "bf16",
                                "whatif.log_every": 4, "whatif.save_every": 2},
                               Targets(loader_site=s.site("# TRAIN"), optimizer_site=s.site("# OPT")),
                               say=lambda t: None)
    try:
        result = run_doctor(DoctorConfig(command=["python", str(s.path)], steps=None, out=tmp_path / "run",
                                         system_sampler=False, count_flops=False))
    finally:
        applied.uninstall()
    assert result.stopped == "end" and result.steps == 16, (result.stopped, result.traceback)
    assert [p.name for p in tmp_path.glob("epoch-*.pt")] == ["epoch-0.pt"]
    joined = " ".join(applied.notes)
    assert "num_workers=1" in joined and "fused=True" in joined and "torch.bfloat16" in joined
    assert not any(n.startswith("failed") for n in applied.notes), applied.notes
    assert (DataLoader.__dict__["__init__"], torch.optim.AdamW.__dict__["__init__"], builtins.print,
            torch.save) == originals
