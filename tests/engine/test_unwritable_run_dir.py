"""The Trainer with a run directory it cannot write (removed, read-only, full): training, its
callbacks and its checkpoints (kept elsewhere) go on; the run directory's loss is said once."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainspeed.engine.events import Callback
from trainspeed.engine.trainer import Trainer

pytestmark = pytest.mark.timeout(120)


class Count(Callback):
    def __init__(self):
        self.steps = 0

    def on_batch_end(self, state):
        self.steps += 1


def test_training_goes_on_without_its_run_directory(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("where the runs directory should be")
    torch.manual_seed(0)
    x = torch.randn(48, 4)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    model = nn.Linear(4, 1)
    count = Count()
    cfg = {"run": {"out_dir": str(blocker), "name": "r", "max_steps": 6},
           "data": {"batch_size": 8}, "logging": {"every": 2, "warmup_steps": 0, "progress": False},
           "eval": {"at_end": False},
           "checkpoint": {"dir": str(tmp_path / "ckpt"), "async_save": False}}
    summary = Trainer(model, lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]), data,
                      config=cfg, callbacks=[count]).fit()
    assert count.steps == 6 and summary["steps"] == 6
    assert (tmp_path / "ckpt" / "step-00000006.pt").exists()
    err = capsys.readouterr().err
    assert err.count("cannot write the run directory") == 1, err
    assert "Traceback" not in err
