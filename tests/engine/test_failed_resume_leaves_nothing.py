"""A `--resume` that fails before the first step leaves no run folder behind: an empty folder,
a damaged checkpoint or one that does not fit the model is refused before anything is written,
or the folders the run made are taken back. A folder that existed before is never removed."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainspeed.engine.checkpoint.atomic import manifest_path
from trainspeed.engine.run_folders import new_folders
from trainspeed.engine.trainer import Trainer
from trainspeed.errors import CheckpointError

pytestmark = pytest.mark.timeout(120)


def _data():
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x.sum(1, keepdim=True))


def mse(model, batch):
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def _cfg(out_dir, name=None, **checkpoint):
    return {"run": {"out_dir": str(out_dir), "name": name, "max_steps": 4},
            "data": {"batch_size": 8}, "logging": {"every": 2, "warmup_steps": 0, "progress": False},
            "eval": {"at_end": False}, "checkpoint": {"async_save": False, **checkpoint}}


@pytest.fixture
def saved(tmp_path):
    """A 4-step run's final checkpoint (a Linear(4, 1) model)."""
    Trainer(nn.Linear(4, 1), mse, _data(), config=_cfg(tmp_path / "done", "a")).fit()
    return tmp_path / "done" / "a" / "checkpoints" / "step-00000004.pt"


def test_an_empty_folder_or_a_damaged_checkpoint_is_refused_before_the_run_folder_is_made(tmp_path, saved):
    empty = tmp_path / "empty"
    empty.mkdir()
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / saved.name).write_bytes(saved.read_bytes()[:200])
    manifest_path(cut / saved.name).write_bytes(manifest_path(saved).read_bytes())
    cases = [(empty, "no intact checkpoint in that directory"), (cut / saved.name, "truncated"),
             (cut, "no intact checkpoint in that directory .*truncated")]
    for resume, says in cases:
        out = tmp_path / "runs"
        with pytest.raises(CheckpointError, match=says):
            Trainer(nn.Linear(4, 1), mse, _data(), config=_cfg(out, resume=str(resume))).fit()
        assert not out.exists(), (resume, sorted(out.rglob("*")))


def test_a_checkpoint_that_does_not_fit_takes_back_the_folders_the_run_made(tmp_path, saved):
    out = tmp_path / "new" / "runs"  # neither exists: both were made by the run
    with pytest.raises(CheckpointError, match="does not fit"):
        Trainer(nn.Linear(4, 2), mse, _data(), config=_cfg(out, "b", resume=str(saved))).fit()
    assert not (tmp_path / "new").exists()
    # an out_dir that held another run before keeps it; only the new run's folder goes
    held = tmp_path / "done"
    with pytest.raises(CheckpointError, match="does not fit"):
        Trainer(nn.Linear(4, 2), mse, _data(), config=_cfg(held, "b", resume=str(saved))).fit()
    assert sorted(p.name for p in held.iterdir()) == ["a"] and saved.exists()
    # a run folder that held something before is kept, with what it held
    mine = held / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="does not fit"):
        Trainer(nn.Linear(4, 2), mse, _data(), config=_cfg(held, "mine", resume=str(saved))).fit()
    assert (mine / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("with_parent", [False, True])
def test_new_folders_notes_only_what_does_not_exist(tmp_path, with_parent):
    base = tmp_path / "base"
    base.mkdir()
    (base / "other-run").mkdir()
    top = base / "runs" if with_parent else base
    made = new_folders(top / "r", top / "r" / "checkpoints", None, base)
    (top / "r" / "checkpoints").mkdir(parents=True)
    (top / "r" / "config.yaml").write_text("x")
    made.remove()
    assert base.exists() and (base / "other-run").exists()
    assert not (top / "r").exists() and (top.exists() == (not with_parent))
