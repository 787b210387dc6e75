"""A wait for DataLoader workers that hardly worked, on a machine whose cores others held, is the
hand-over waiting for a core, not a data-bound script (issue 32, karpathy/makemore under
doctor_truth: 'data-bound' (warning) with 4 workers that used ~0 ms of CPU per step, while the
batch built in the training process took 1 ms and the script's 0-worker arm ran slower)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainspeed.doctor.checks import CheckContext, data
from trainspeed.telemetry.rundir import RunData
from trainspeed.telemetry.schema import make_event
from trainspeed.telemetry.summary import summarize

pytestmark = pytest.mark.timeout(30)

LOADER = {"kind": "dataloader", "role": "train", "num_workers": 4, "pin_memory": False,
          "persistent_workers": False, "batch_size": 32, "cores": 2, "iters": 1, "iter_seconds": 0.0}


def _run(*, others: float, workers_cores: float, n: int = 120) -> RunData:
    """A 110 ms step of which 12 ms wait for the next batch; this process gets 0.23 of a core,
    its workers `workers_cores` more (the sampler's cpu_tree), others `others` % of one core."""
    wall, cpu, wait = 0.110, 0.025, 0.012
    t_wall = 1000.0 + wall * np.arange(1, n + 1)
    steps = [{"schema": 1, "step": i, "t_step": wall, "t_wall": float(t_wall[i - 1]), "cpu": cpu, "samples": 32,
              "warmup": i <= 5,
              "phases": {"data": wait, "forward": 0.03, "backward": 0.06, "other": wall - wait - 0.09}}
             for i in range(1, n + 1)]
    rows = np.arange(1000.0, float(t_wall[-1]), 1.0)
    series = {"t": rows.tolist(), "cpu_others": [others] * rows.size,
              "cpu_tree": [100.0 * (cpu / wall + workers_cores)] * rows.size}
    events = [make_event("run_start", 0, 0.0, device="cpu", precision="fp32"),
              make_event("observation", 0, 0.0, **LOADER),
              {"type": "system", "data": {"series": series}}]
    return RunData(path=Path("."), env={"cpu": {"available_cores": 2, "torch_threads": 1}}, steps=steps, events=events)


def _finding(run: RunData):
    return data.data_bound(CheckContext.from_run(run, summarize(run)))


def test_idle_workers_on_a_full_machine_are_not_a_data_bound_script():
    f = _finding(_run(others=177.0, workers_cores=0.0))
    assert f is not None and f.severity == "info" and f.impact == 0.0, f
    assert "wait for a core" in f.title and "the workers used 0.0 ms of CPU per step" in f.evidence


def test_workers_that_work_through_the_wait_are_still_data_bound():
    # 0.1 core for the workers: 11 ms of CPU per 110 ms step, all of the 12 ms wait
    f = _finding(_run(others=177.0, workers_cores=0.1))
    assert f is not None and f.severity == "warning" and "cheaper" in f.recommendation
    # its 4 workers on 2 cores: fewer; never none, since the workers' 11 ms a step outweigh a hand-over
    assert f.recommendation.startswith("4 workers and the training process share 2 cores: use fewer (")
    assert "or none" not in f.recommendation
    # the count it advises, for a tune's measurement of it to replace (doctor/tuned.py)
    assert f.advises == {"num_workers": "1"} and f.otherwise.startswith("make per-sample work cheaper")


def test_idle_workers_on_a_quiet_machine_are_still_data_bound():
    # nothing else held the cores: workers that wait on a slow disk use no CPU either
    f = _finding(_run(others=5.0, workers_cores=0.0))
    assert f is not None and f.severity == "warning"
