"""An evaluation that runs after optimizer step N is recorded at step N, as the checkpoint of
that step and its step record are: it was recorded at N-1 (the Monitor's count before the
step's record is closed), and the console said "eval @ step 2" for the eval of step 3."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainspeed.engine.trainer import Trainer
from trainspeed.sinks.console import event_line
from trainspeed.telemetry import read_run

pytestmark = pytest.mark.timeout(120)


def mse(model, batch):
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def _data(n, seed):
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, x.sum(1, keepdim=True))


@pytest.mark.parametrize("async_save", [False, True])
def test_eval_at_step_n_is_recorded_at_step_n_like_its_checkpoint(tmp_path, async_save):
    cfg = {"run": {"out_dir": str(tmp_path), "name": "r", "max_steps": 6},
           "data": {"batch_size": 8}, "logging": {"every": 1, "warmup_steps": 0, "progress": False},
           "eval": {"every_steps": 3, "at_end": True},
           "checkpoint": {"every_steps": 3, "async_save": async_save, "save_final": False}}
    Trainer(nn.Linear(4, 1), mse, _data(64, 0), _data(16, 1), config=cfg).fit()
    run = read_run(tmp_path / "r")
    evals = run.events_of("eval")
    saves = [e["data"]["ckpt_step"] for e in run.events_of("checkpoint")]
    assert [e["step"] for e in evals] == [3, 6] == saves  # at_end: step 6 was evaluated already
    steps = {r["step"]: r for r in run.steps}
    assert all(steps[e["step"]]["phases"]["eval"] > 0 for e in evals)  # the step record that paid for it
    assert event_line(evals[0]).startswith("[trainspeed] eval @ step 3: ")
