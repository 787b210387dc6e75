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


def _run(on: int, *, threads: int, grow: float = 0.0, seed: int = 0, cpu_rise: float | None = None,
         wait: float = 1.05, others: tuple[float, float] | None = None) -> RunData:
    """Steps 1..N; other processes read 40-60 % of one core before step `on`, 140-160 % from
    it on (one busy loop), or `others` (% of one core) throughout; from `on` the step's CPU time
    rises `cpu_rise` times (default: 2x with 2+ threads on 2 cores, spinning; 1x with one) and
    its wall time `wait` times that. `grow`: the script's own growth of its "other" phase,
    seconds per step over the run."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, N + 1)
    loaded = steps >= on
    own = 0.050 * (1 + 0.03 * rng.standard_normal(N)) + grow * steps / N
    rise = cpu_rise if cpu_rise is not None else (2.0 if threads >= 2 else 1.0)
    cpu = own * np.where(loaded, rise, 1.0)
    wall = cpu * np.where(loaded, wait, 1.0)
    t_wall = 1000.0 + np.cumsum(wall)
    records = [{"schema": 1, "step": int(s), "t_step": float(w), "t_wall": float(t), "cpu": float(c),
                "warmup": bool(s <= 5), "samples": 8,
                "phases": {"data": float(0.7 * (w - g * s / N)), "forward": float(0.3 * (w - g * s / N)),
                           "other": float(g * s / N)}}
               for s, w, t, c, g in zip(steps, wall, t_wall, cpu, [grow] * N)]
    t_rows = np.arange(1000.0, float(t_wall[-1]) + 1.0, 1.0)
    step_of_row = np.searchsorted(t_wall, t_rows).clip(0, N - 1)
    if others is None:
        readings = np.where(steps[step_of_row] >= on, rng.uniform(140, 160, t_rows.size),
                            rng.uniform(40, 60, t_rows.size))
    else:
        readings = rng.uniform(*others, t_rows.size)
    series = {"t": t_rows.tolist(), "cpu_others": readings.tolist()}
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


def test_one_thread_under_a_changing_load_cannot_be_told_either():
    # one compute thread cannot spin, but its CPU time per step still moves with the load
    # (hyperthreads share a core): with too few steps at the start's load, nothing can tell
    finding = _growth(_run(60, threads=1, cpu_rise=1.5))
    assert finding is not None and finding["severity"] == "info" and "cannot tell" in finding["title"]


def test_a_real_growth_is_found_on_the_steps_level_with_the_start():
    grown = _run(200, threads=2, grow=0.080)  # the script's own growth: 50 -> 130 ms over the run
    finding = _growth(grown)
    assert finding is not None and finding["severity"] in ("warning", "critical")
    assert 'in phase "other"' in finding["evidence"] or "outside the measured phases" in finding["evidence"]
    assert "their load level with the start's" in finding["evidence"]


def test_a_saturated_machine_shows_its_new_load_in_what_this_process_gets():
    # others read 1.8-1.9 cores before and after two more busy loops came (they cannot pass
    # the cores); this one thread got half as much from step 110 and its CPU time per step rose
    # 50 % (hyperthreads): judged on CPU time, a 'step time grows' warning (teacher_ema, loaded)
    run = _run(110, threads=1, cpu_rise=1.5, wait=2.0, others=(180, 190))
    keep = np.array([not r["warmup"] for r in run.steps])
    _, _, _, basis = robust_series(run, keep)
    assert basis == "quiet"
    assert _growth(run) is None


def test_a_phase_whose_share_grows_under_a_changing_load_is_still_the_scripts_growth():
    # too few steps at the start's load, but the "other" phase's share of the step grows: a
    # load slows every phase alike, so this growth is the script's (judged on CPU time)
    finding = _growth(_run(60, threads=1, cpu_rise=1.2, grow=0.080))
    assert finding is not None and finding["severity"] in ("warning", "critical"), finding
    assert "cannot tell" not in finding["title"]
