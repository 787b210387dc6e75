"""A trend is judged only on what a changing load cannot move (issue 32): injected load
readings, deterministic. A data-bound step of 50 ms (wall == CPU, one process) whose 2 compute
threads spin once one busy loop takes a core of 2: from the load's start both its wall and its
CPU time per step double, while the script itself does the same work every step."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainspeed.doctor.checks import diagnose
from trainspeed.telemetry.rundir import RunData
from trainspeed.telemetry.summary import robust_series, summarize

pytestmark = pytest.mark.timeout(60)

N = 400


def _run(on: int, *, threads: int, grow: float = 0.0, seed: int = 0) -> RunData:
    """Steps 1..N; other processes read 40-60 % of one core before step `on`, 140-160 % from
    it on (one busy loop); the step's wall and CPU time double from `on` when the threads do
    not fit in the cores left free (2 threads, 2 cores). `grow`: the script's own growth of
    its "other" phase, seconds per step over the run."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, N + 1)
    loaded = steps >= on
    own = 0.050 * (1 + 0.03 * rng.standard_normal(N)) + grow * steps / N
    spin = np.where(loaded & (threads >= 2), 2.0, 1.0)
    cpu = own * spin
    wall = cpu * np.where(loaded, 1.05, 1.0)
    t_wall = 1000.0 + np.cumsum(wall)
    records = [{"schema": 1, "step": int(s), "t_step": float(w), "t_wall": float(t), "cpu": float(c),
                "warmup": bool(s <= 5), "samples": 8,
                "phases": {"data": float(0.7 * (w - g * s / N)), "forward": float(0.3 * (w - g * s / N)),
                           "other": float(g * s / N)}}
               for s, w, t, c, g in zip(steps, wall, t_wall, cpu, [grow] * N)]
    t_rows = np.arange(1000.0, float(t_wall[-1]) + 1.0, 1.0)
    step_of_row = np.searchsorted(t_wall, t_rows).clip(0, N - 1)
    others = np.where(steps[step_of_row] >= on, rng.uniform(140, 160, t_rows.size), rng.uniform(40, 60, t_rows.size))
    series = {"t": t_rows.tolist(), "cpu_others": others.tolist()}
    env = {"cpu": {"torch_threads": threads, "available_cores": 2}}
    return RunData(path=Path("loaded"), env=env, steps=records,
                   events=[{"type": "system", "data": {"series": series}}])


def _growth(run: RunData):
    return next((f for f in diagnose(run, summarize(run)) if f["id"] == "step_time_growth"), None)


def test_a_load_from_a_quarter_in_is_judged_on_the_steps_level_with_the_start():
    # 109 steps before the load: fewer than 30 % quiet, so the old rule judged CPU time per step
    # (2x under the load with spinning threads) and said 'step time grows', critical
    run = _run(110, threads=2)
    keep = np.array([not r["warmup"] for r in run.steps])
    _, _, _, basis = robust_series(run, keep)
    assert basis == "quiet"
    assert _growth(run) is None


def test_a_load_from_the_start_of_the_run_cannot_be_told_from_growth():
    run = _run(60, threads=2)  # 55 steps before it, 35 of them with quiet neighbours
    finding = _growth(run)
    assert finding is not None and finding["severity"] == "info" and finding["impact"] == 0.0
    assert "cannot tell" in finding["title"]


def test_one_thread_that_fits_in_the_free_cores_keeps_its_cpu_time_as_evidence():
    # one compute thread beside one busy loop on 2 cores: no spin, its CPU time per step holds
    run = _run(30, threads=1)
    assert _growth(run) is None
    grown = _run(30, threads=1, grow=0.080)  # the script's own growth: 50 -> 130 ms
    finding = _growth(grown)
    assert finding is not None and finding["severity"] in ("warning", "critical")
    assert 'in phase "other"' in finding["evidence"] or "outside the measured phases" in finding["evidence"]
