"""The machine's own speed drifts over seconds; the script's growth is told from it by the
phases' shares of the step. Deterministic runs built from records: a 160-step doctor run of a
17 ms step (forward, backward, optimizer, a log line), CPU time equal to wall time, other
processes quiet throughout (what CI saw: 'step time grows' on an unchanged script whose steps
went 14 -> 18 ms from step 123, and a planted growth missed because the run started in a slow
stretch of the VM)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainspeed.doctor.checks import diagnose
from trainspeed.telemetry.phase_shares import DRIFT_RATIO, machine_drift, share_growth_ratio
from trainspeed.telemetry.rundir import RunData
from trainspeed.telemetry.summary import summarize

pytestmark = pytest.mark.timeout(60)

N = 160
SHARES = {"forward": 0.35, "backward": 0.45, "optimizer": 0.15, "log": 0.05}


def _run(speed: np.ndarray, *, log_growth: float = 0.0, grow_all: float = 0.0, seed: int = 0) -> RunData:
    """Steps 1..N of a 17 ms step whose every phase takes `speed[i]` times its time (the
    machine's drift); `log_growth`: seconds the log line's own work adds by the last step;
    `grow_all`: the whole step's own growth by the last step (a fraction)."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, N + 1)
    records, t = [], 1000.0
    for i, s in enumerate(steps):
        noise = 1 + 0.02 * rng.standard_normal()
        own = {k: 0.017 * v * (1 + grow_all * s / N) for k, v in SHARES.items()}
        own["log"] += log_growth * s / N
        phases = {k: float(v * speed[i] * noise) for k, v in own.items()}
        wall = sum(phases.values())
        t += wall
        records.append({"schema": 1, "step": int(s), "t_step": wall, "t_wall": t, "cpu": wall,
                        "warmup": bool(s <= 5), "samples": 512, "phases": phases})
    rows = np.arange(1000.0, t + 0.25, 0.25)
    series = {"t": rows.tolist(), "cpu_others": rng.uniform(0, 5, rows.size).tolist()}
    env = {"cpu": {"torch_threads": 1, "available_cores": 2}}
    return RunData(path=Path("drift"), env=env, steps=records,
                   events=[{"type": "system", "data": {"series": series}}])


def _growth(run: RunData):
    summary = summarize(run)
    return summary, next((f for f in diagnose(run, summary) if f["id"] == "step_time_growth"), None)


def test_the_machine_slowing_every_phase_alike_late_in_the_run_is_not_growth():
    speed = np.where(np.arange(1, N + 1) >= 123, 1.29, 1.0)  # CI: 14 -> 18 ms from step 123
    summary, found = _growth(_run(speed))
    assert found is None and summary["trend"] is None


def test_a_slow_drift_of_the_whole_step_is_not_growth():
    speed = np.linspace(1.0, 1.3, N)
    summary, found = _growth(_run(speed))
    assert found is None and summary["trend"] is None


def test_a_whole_step_that_grows_beyond_what_the_machine_drifts_is_still_growth():
    summary, found = _growth(_run(np.ones(N), grow_all=1.0))  # x2 by the end, every phase alike
    assert found is not None and found["severity"] in ("warning", "critical")
    assert summary["trend"]["kind"] == "growth"


def test_a_growing_log_line_is_found_through_a_slow_start():
    # the first 40 steps ran 1.35x slow; the log line's work adds 5.5 ms by the end: the wall
    # times' quarters read x1.13, under the reporting threshold
    speed = np.where(np.arange(1, N + 1) <= 40, 1.35, 1.0)
    summary, found = _growth(_run(speed, log_growth=0.0055))
    assert found is not None, summary["trend"]
    assert 'in phase "log"' in found["evidence"]
    assert "drifting over seconds" in found["evidence"]
    assert found["impact"] > 0.1


def test_the_same_log_line_on_a_steady_machine_reads_the_same_way():
    _, steady = _growth(_run(np.ones(N), log_growth=0.0055))
    assert steady is not None and 'in phase "log"' in steady["evidence"]
    assert "drifting" not in steady["evidence"]  # wall times tell it: no share needed


def test_share_growth_ratio_is_the_step_growth_a_share_implies():
    wall = np.full(40, 0.02)
    phases = {"log": np.r_[np.full(20, 0.0008), np.full(20, 0.0084)],
              "forward": np.r_[np.full(20, 0.0192), np.full(20, 0.0116)]}
    name, ratio = share_growth_ratio(wall, phases)
    assert name == "log"
    assert ratio == pytest.approx((1 - 0.04) / (1 - 0.42))
    # every phase scaled alike: no share grows
    alike = {"log": np.r_[np.full(20, 0.001), np.full(20, 0.0013)],
             "forward": np.r_[np.full(20, 0.019), np.full(20, 0.0247)]}
    assert share_growth_ratio(wall, alike) is None


def test_machine_drift_is_bounded_by_the_ratio_and_the_shares():
    phases = {"forward": np.r_[np.full(20, 0.010), np.full(20, 0.013)],
              "backward": np.r_[np.full(20, 0.010), np.full(20, 0.013)]}
    assert machine_drift(np.r_[np.full(20, 0.02), np.full(20, 0.026)], phases)
    big = DRIFT_RATIO + 0.1
    assert not machine_drift(np.r_[np.full(20, 0.02), np.full(20, 0.02 * big)], phases)
    moved = {"forward": np.r_[np.full(20, 0.010), np.full(20, 0.016)],
             "backward": np.r_[np.full(20, 0.010), np.full(20, 0.010)]}
    assert not machine_drift(np.r_[np.full(20, 0.02), np.full(20, 0.026)], moved)
