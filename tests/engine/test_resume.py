"""Exact resume through the Trainer: 2N steps straight == N steps, stop, resume, N more —
identical losses and parameters bit for bit on CPU, stopping mid-epoch."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainspeed.engine.events import Callback
from trainspeed.engine.trainer import Trainer
from trainspeed.telemetry import read_run

pytestmark = pytest.mark.timeout(240)


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(80, 6, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(80, 1, generator=g))


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 1))


def mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


class StopAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_batch_end(self, state):
        if state.step == self.step:
            state.should_stop = True


def _cfg(tmp_path, name, workers, **ckpt):
    return {"run": {"out_dir": str(tmp_path), "name": name, "max_steps": 16, "seed": 7},
            "data": {"batch_size": 8, "shuffle": True, "num_workers": workers},
            "optim": {"schedule": "cosine", "warmup_steps": 3},
            "logging": {"every": 4, "warmup_steps": 0, "progress": False},
            "eval": {"at_end": False}, "checkpoint": {"save_final": True, "async_save": True, **ckpt}}


@pytest.mark.parametrize("workers", [0, 2])
def test_stop_mid_epoch_and_resume_is_bit_exact(tmp_path, workers):
    straight = _model()
    Trainer(straight, mse, _data(), config=_cfg(tmp_path, "straight", workers)).fit()
    # 10 batches per epoch: stopping at step 7 is mid-epoch
    first = _model()
    Trainer(first, mse, _data(), config=_cfg(tmp_path, "part", workers), callbacks=[StopAt(7)]).fit()
    ckpt = tmp_path / "part" / "checkpoints" / "step-00000007.pt"
    assert ckpt.exists()
    resumed = _model()  # fresh weights: everything must come from the checkpoint
    Trainer(resumed, mse, _data(), config=_cfg(tmp_path, "part", workers, auto_resume=True)).fit()
    for p, q in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
    a = {r["step"]: r["loss"] for r in read_run(tmp_path / "straight").steps}
    b = {r["step"]: r["loss"] for r in read_run(tmp_path / "part").steps}
    assert sorted(b) == list(range(1, 17))
    assert [b[i] for i in range(1, 17)] == [a[i] for i in range(1, 17)]
    restarts = [e["data"] for e in read_run(tmp_path / "part").events_of("restart")]
    assert any(d.get("at_step") == 7 for d in restarts), restarts


def test_wrong_model_checkpoint_is_a_clear_error(tmp_path):
    Trainer(_model(), mse, _data(), config=_cfg(tmp_path, "a", 0)).fit()
    path = tmp_path / "a" / "checkpoints" / "step-00000016.pt"
    wider = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 1))
    from trainspeed.errors import CheckpointError

    with pytest.raises(CheckpointError, match="shape"):
        Trainer(wider, mse, _data(), config=_cfg(tmp_path, "b", 0, resume=str(path))).fit()
