"""The doctor stops the script's DataLoader workers when the script is over.

A persistent iterator sits in a reference cycle with the script's globals. Collected later by
the cyclic garbage collector, its index queues' finalizers ran first (their feeder threads
ended), then its `__del__`: the shutdown's `None` never reached a worker and each worker
cost `_shutdown_workers`' 5 s join timeout. On an H100 a 16-worker tune trial of a data-bound
script paid 80 s and the tune's verification went unrun; here, 2 workers added 10 s to a
10-step doctor run (14.5 s against 5.6 s)."""

from __future__ import annotations

import gc
import sys
import time

import psutil
import pytest

from trainspeed.doctor.runner import DoctorConfig, run_doctor

pytestmark = pytest.mark.timeout(90)

SCRIPT = '''import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        return torch.full((8,), float(i % 7)), torch.tensor([float(i % 3)])


loader = DataLoader(Squares(), batch_size=32, num_workers=2, persistent_workers=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(100):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def _workers() -> list[psutil.Process]:
    return [c for c in psutil.Process().children(recursive=True) if c.is_running()
            and c.status() != psutil.STATUS_ZOMBIE]


def test_stopped_run_leaves_no_loader_workers_and_no_join_timeouts(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    gc.collect()
    before = {p.pid for p in _workers()}
    gc.disable()  # the cycle must not be collected behind the test's back: only the doctor may stop them
    try:
        result = run_doctor(DoctorConfig(command=[sys.executable, str(script)], steps=6, out=tmp_path / "run",
                                         system_sampler=False))
        left = [p for p in _workers() if p.pid not in before]
        t0 = time.perf_counter()
        gc.collect()  # what used to wait out 5 s per worker
        collect_s = time.perf_counter() - t0
    finally:
        gc.enable()
    assert result.exit_code == 0 and result.stopped == "steps" and result.steps == 6
    assert left == [], f"DataLoader workers still running after the doctor returned: {left}"
    assert collect_s < 4.0, f"collecting the script's loader took {collect_s:.1f} s (a worker's join timeout)"
