"""TrainspeedCallback in a real Lightning fit: a valid run directory, true phases, findings."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

L = pytest.importorskip("lightning.pytorch")

from trainspeed.integrations.lightning import TrainspeedCallback  # noqa: E402
from trainspeed.telemetry import read_run  # noqa: E402

pytestmark = pytest.mark.timeout(120)


class SlowData(Dataset):
    """A planted input-pipeline problem: 4 ms of 'decoding' per sample, loaded in the main process."""

    def __init__(self, n=64, delay=0.004):
        g = torch.Generator().manual_seed(0)
        self.x, self.delay = torch.randn(n, 8, generator=g), delay

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.x[i], self.x[i].sum(0, keepdim=True)


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _fit(tmp_path, callback, **trainer_kwargs):
    kwargs = dict(max_steps=10, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                  limit_val_batches=0)
    kwargs.update(trainer_kwargs)
    trainer = L.Trainer(callbacks=[callback], **kwargs)
    trainer.fit(Tiny(), DataLoader(SlowData(), batch_size=4), trainer_kwargs.get("val_dataloaders"))
    return trainer


def test_fit_writes_run_dir_with_phases_and_findings(tmp_path):
    cb = TrainspeedCallback(tmp_path / "run", log_every=4, warmup_steps=1, report=False)
    _fit(tmp_path, cb)
    run = read_run(tmp_path / "run")
    assert [r["step"] for r in run.steps] == list(range(1, 11))
    assert all(r["samples"] == 4 for r in run.steps)
    assert all(r["loss"] is not None and r["loss"] > 0 for r in run.steps)
    later = run.steps[1:]  # step 1 starts at its first hook: no data wait before it
    for phase in ("data", "forward", "backward", "optimizer"):
        assert all(r["phases"][phase] > 0 for r in later), phase
    # 4 samples x 4 ms of loading per step dominates a 8x16 MLP: the data phase shows it ...
    assert all(r["phases"]["data"] >= 0.012 for r in later)
    # ... and the findings name it, first
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["findings"][0]["id"] == "data_bound"
    assert cb.findings[0]["id"] == "data_bound"
    assert report["summary"]["steps"] == 10
    assert (tmp_path / "run" / "env.json").exists()
    assert json.loads(json.dumps(report))  # plain JSON


def test_accumulation_gives_one_record_per_optimizer_step(tmp_path):
    cb = TrainspeedCallback(tmp_path / "run", log_every=2, warmup_steps=0, report=False)
    _fit(tmp_path, cb, max_steps=3, accumulate_grad_batches=2)
    run = read_run(tmp_path / "run")
    assert [r["samples"] for r in run.steps] == [8, 8, 8]


def test_validation_is_eval_and_profile_window(tmp_path):
    class FastData(SlowData):
        def __init__(self):
            super().__init__(n=32, delay=0.0)

    cb = TrainspeedCallback(tmp_path / "run", log_every=3, warmup_steps=0, report=False, profile_steps="2-3")
    trainer = L.Trainer(callbacks=[cb], max_steps=6, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        val_check_interval=4, limit_val_batches=2, num_sanity_val_steps=1)
    trainer.fit(Tiny(), DataLoader(FastData(), batch_size=4), DataLoader(FastData(), batch_size=4))
    run = read_run(tmp_path / "run")
    evals = [r["step"] for r in run.steps if r["phases"]["eval"] > 0]
    assert evals == [5]  # validation after step 4 runs before step 5's batch (sanity check excluded)
    with open(tmp_path / "run" / "profile_steps_2-3.json") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert {"trainspeed.forward", "trainspeed.backward", "trainspeed.optimizer", "trainspeed.data"} <= names
    assert "trainspeed.step#4" not in names


def test_crash_in_fit_still_writes_report(tmp_path):
    class Boom(Tiny):
        def training_step(self, batch, batch_idx):
            if batch_idx == 3:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    cb = TrainspeedCallback(tmp_path / "run", log_every=10, report=False)
    trainer = L.Trainer(callbacks=[cb], max_steps=10, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom(), DataLoader(SlowData(delay=0.0), batch_size=4))
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert "RuntimeError: boom" in report["traceback"]
    assert len(read_run(tmp_path / "run").steps) == 3


def test_second_fit_gets_its_own_default_run_dir(tmp_path):
    cb = TrainspeedCallback(log_every=2, warmup_steps=0, report=False)
    _fit(tmp_path, cb, max_steps=2)
    first = cb.run_dir
    _fit(tmp_path, cb, max_steps=2)
    assert cb.run_dir != first and cb.run_dir.parent == tmp_path / "trainspeed"
    assert cb.summary["steps"] == 2
    assert [len(read_run(d).steps) for d in (first, cb.run_dir)] == [2, 2]


def test_missing_lightning_names_the_extra(monkeypatch):
    import importlib
    import sys

    from trainspeed.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.delitem(sys.modules, "trainspeed.integrations.lightning")
    with pytest.raises(MissingDependencyError, match=r"trainspeed\[lightning\]"):
        importlib.import_module("trainspeed.integrations.lightning")
