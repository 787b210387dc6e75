"""The Trainer's per-step work, pinned where no machine load can move it: the Python frames of
trainspeed's own code in a steady step, and callbacks' no-op hooks never called."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import trainspeed
from trainspeed.engine.events import Callback
from trainspeed.engine.trainer import Trainer

pytestmark = pytest.mark.timeout(120)

PACKAGE = str(Path(trainspeed.__file__).parent)


def test_a_steady_step_runs_four_frames_of_trainspeed_and_no_fire(tmp_path):
    calls: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            calls[f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"] += 1

    class Probe(Callback):  # overrides one event: the other hooks are never called
        def on_batch_end(self, state):
            if state.step == 5:
                sys.setprofile(profile)
            elif state.step == 15:
                sys.setprofile(None)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 6, generator=g), torch.randn(256, 1, generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    cfg = {"run": {"out_dir": str(tmp_path), "name": "t", "max_steps": 20},
           "data": {"batch_size": 8}, "logging": {"every": 50, "progress": False},
           "checkpoint": {"save_final": False}, "eval": {"at_end": False}}

    def loss_fn(model, batch):
        return nn.functional.mse_loss(model(batch[0]), batch[1])

    Trainer(model, loss_fn, data, config=cfg, callbacks=[Probe()]).fit()
    # 10 steps: the step, the batch's stats, the sampler's position, the Monitor's step; no
    # CallbackList.fire frame and no Callback no-op (before: fire ran every step too)
    assert calls == {"trainer.py:_train_step": 10, "stats.py:batch_stats": 10,
                     "samplers.py:advance": 10, "monitor.py:step": 10}, calls
