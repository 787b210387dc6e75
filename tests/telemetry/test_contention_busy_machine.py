"""Contention on a machine that was busy before the load came (benchmarks/doctor_truth.py, issue
25): the numbers are those of nanoGPT-style and word-LM runs on a shared 2-core VM where other
tenants already used 1.3 cores and two busy loops started halfway through the run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainspeed.telemetry.contention import detect_contention, loaded_mask, robust_step_times
from trainspeed.telemetry.rundir import RunData
from trainspeed.telemetry.summary import robust_series
from trainspeed.telemetry.trend import detect_trend

pytestmark = pytest.mark.timeout(30)

N = 400
ON = 200


def _saturated(seed: int = 0):
    """A 14 ms single-threaded step (wall == CPU when quiet). Other processes read 120-140 % of
    one core before step ON and 150-170 % from it on: the machine was full, so they gain only
    what the script loses (~30 points, under LOAD_MIN's 40), while each step waits 2.3x as long
    for the cores at the same CPU time."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, N + 1, dtype=float)
    loaded = steps >= ON
    cpu = 0.014 * (1 + 0.05 * rng.standard_normal(N))
    wall = cpu * np.where(loaded, 2.3, 1.0) * (1 + 0.05 * np.abs(rng.standard_normal(N)))
    others = np.where(loaded, rng.uniform(150, 170, N), rng.uniform(120, 140, N))
    phases = {"forward": 0.4 * wall, "backward": 0.6 * wall}
    return steps, wall, cpu, others, phases


def test_a_smaller_rise_with_waiting_steps_is_load_on_a_busy_machine():
    steps, wall, cpu, others, phases = _saturated()
    floor = float(others.min())
    mask = loaded_mask(others, floor, near=others, wall=wall, cpu=cpu)
    # LOAD_MIN alone catches only the readings >= floor + 40 (a few); the waiting steps count too
    assert mask[steps >= ON].mean() > 0.95 and mask[steps < ON].mean() < 0.05
    found = detect_contention(steps, wall, cpu, others, floor=floor, near=others)
    assert found is not None and found.first_step == ON and found.loaded_steps > 0.95 * (N - ON + 1)
    # ...so the script's trend, judged on the quiet steps, stays flat
    kept, times, ph, basis = robust_step_times(wall, cpu, phases, mask)
    assert basis == "quiet" and detect_trend(steps[kept], times, ph, min_steps=40) is None


def test_a_smaller_rise_without_waiting_is_not_load():
    steps, wall, cpu, others, phases = _saturated()
    wall = cpu.copy()  # others read higher, yet no step waited: nothing to take out
    floor = float(others.min())
    mask = loaded_mask(others, floor, near=others, wall=wall, cpu=cpu)
    np.testing.assert_array_equal(mask, loaded_mask(others, floor))  # LOAD_MIN's readings only
    assert detect_contention(steps, wall, cpu, others, floor=floor, near=others) is None


def _run(steps, wall, cpu, others, *, rows_end: float) -> RunData:
    """A run whose system sampler read once a second until `rows_end` (seconds after the start)."""
    t_wall = 1000.0 + np.cumsum(wall)
    records = [{"step": int(s), "t_step": float(w), "t_wall": float(t), "cpu": float(c), "warmup": False,
                "phases": {"forward": float(0.4 * w), "backward": float(0.6 * w)}}
               for s, w, t, c in zip(steps, wall, t_wall, cpu)]
    t_rows = 1000.0 + np.arange(0.0, rows_end, 1.0)
    step_of_row = np.searchsorted(t_wall, t_rows).clip(0, len(steps) - 1)
    series = {"t": t_rows.tolist(), "cpu_others": [None, *others[step_of_row][1:].tolist()]}
    return RunData(path=Path("busy"), steps=records, events=[{"type": "system", "data": {"series": series}}])


def test_steps_after_the_last_sampler_reading_are_not_judged_quiet():
    # the load lasts to the end of the run; the sampler's last row came ~1.5 s before the end,
    # so the last ~50 steps have no reading: counted as quiet, their 2.3x wall read as growth
    steps, wall, cpu, others, _ = _saturated()
    others = np.where(steps >= ON, others + 30.0, others)  # a clear load: LOAD_MIN alone sees it
    run = _run(steps, wall, cpu, others, rows_end=float(np.sum(wall)) - 1.5)
    keep = np.ones(N, dtype=bool)
    kept, times, phases, basis = robust_series(run, keep)
    assert basis == "quiet"
    assert kept.max() < ON, kept.max()  # the unread tail is not among the quiet steps
    assert detect_trend(kept, times, phases, min_steps=40) is None
