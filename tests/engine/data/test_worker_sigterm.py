"""A SIGTERM sent to the whole process group (a scheduler, `kill -- -PGID`) reaches the loader's
workers too. PyTorch's workers died of it and the main process raised 'DataLoader worker (pid N)
is killed by signal: Terminated' mid-step: a crash with exit 1 instead of the save at the step
boundary. The workers now leave that decision to the main process; the loader's own shutdown
(the parent's SIGTERM) still ends them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import Dataset

from trainspeed.config import DataConfig
from trainspeed.engine.data import build_dataloader

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not hasattr(signal, "sigwaitinfo") or sys.platform != "linux",
                                 reason="SIGTERM by sender needs Linux")]


class Slow(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        time.sleep(0.005)
        return torch.tensor([float(i)])


def _iterator():
    bundle = build_dataloader(Slow(), DataConfig(batch_size=4, num_workers=1, shuffle=False), seed=0)
    it = iter(bundle.loader)
    first = next(it)
    return it, first, it._workers[0]


def test_a_sigterm_from_another_process_leaves_the_worker_running():
    it, first, worker = _iterator()
    subprocess.run(["kill", "-TERM", str(worker.pid)], check=True)  # not the worker's parent
    time.sleep(0.5)
    assert worker.is_alive() and worker.exitcode is None
    rest = list(it)  # no 'DataLoader worker ... is killed by signal: Terminated'
    assert len(rest) == 15 and float(rest[-1][-1]) == 63.0


def test_the_parents_sigterm_still_ends_the_worker():
    it, _, worker = _iterator()
    os.kill(worker.pid, signal.SIGTERM)  # what the loader's shutdown (terminate()) sends
    worker.join(timeout=10)
    assert worker.exitcode == 0  # as PyTorch's own handler ends it: no error in the parent
    del it
