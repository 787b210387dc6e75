"""A run whose checkpoint disk fills: the save that does not fit leaves the one before intact,
the error names that checkpoint and how to resume from it, and the resume, once there is space,
continues from it. ENOSPC is injected (checkpoint/disk_full.py): no root, no tmpfs; the same
run on a 15 MB tmpfs read the same."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import pytest

from trainspeed.engine.events import Callback
from trainspeed.engine.trainer import Trainer
from trainspeed.errors import DiskFullError

sys.path.insert(0, str(Path(__file__).parent / "checkpoint"))
from disk_full import full_disk  # noqa: E402
from engine_tiny import mse, tiny_data, tiny_model  # noqa: E402

pytestmark = pytest.mark.timeout(120)


class FillsAt(Callback):
    """The checkpoint disk is full from the end of step `step` on, once the save before it is
    written whole (an async save's manifest lands after the next step begins)."""

    def __init__(self, step, root, stack, after=None):
        self.step, self.root, self.stack, self.after = step, root, stack, after

    def on_batch_end(self, state):
        if state.step == self.step:
            deadline = time.monotonic() + 20
            while self.after and not (self.root / self.after).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            self.stack.enter_context(full_disk(self.root, budget=0))


def _cfg(tmp_path, **ckpt):
    return {"run": {"out_dir": str(tmp_path), "name": "r", "max_steps": 8, "seed": 3},
            "data": {"batch_size": 8},
            "logging": {"every": 1, "warmup_steps": 0, "progress": False},
            "eval": {"at_end": False}, "checkpoint": {"every_steps": 2, **ckpt}}


@pytest.mark.parametrize("async_save", [False, True])
def test_a_full_disk_names_the_checkpoint_kept_and_how_to_resume(tmp_path, async_save):
    ckpts = tmp_path / "r" / "checkpoints"
    with contextlib.ExitStack() as stack, pytest.raises(DiskFullError) as info:
        Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, async_save=async_save),
                callbacks=[FillsAt(3, ckpts, stack, after="step-00000002.pt.json")]).fit()
    message = str(info.value)
    assert message.startswith(f"no space left on {ckpts}") and "\n" not in message, message
    kept = ckpts / "step-00000002.pt"
    assert f"the last checkpoint written, step 2 ({kept}), is kept: once there is space, resume with " \
           in message, message
    assert "checkpoint.auto_resume=true and run.name=r" in message  # not a trainspeed CLI: the keys
    again = Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, async_save=async_save, auto_resume=True))
    again.fit()
    assert again.state.step == 8
    assert (ckpts / "step-00000008.pt").exists()


def test_a_full_disk_before_any_checkpoint_says_nothing_of_one(tmp_path):
    ckpts = tmp_path / "r" / "checkpoints"
    with contextlib.ExitStack() as stack, pytest.raises(DiskFullError) as info:
        Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, async_save=False),
                callbacks=[FillsAt(1, ckpts, stack)]).fit()
    assert "last checkpoint written" not in str(info.value)
