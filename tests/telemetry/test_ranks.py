"""Per-rank figures and straggler detection on synthetic step records."""

from __future__ import annotations

import json

import pytest

from trainspeed.doctor.checks import diagnose
from trainspeed.report.ranks import rank_rows
from trainspeed.telemetry.ranks import find_stragglers, rank_dir, rank_dirs, rank_figures, rank_table
from trainspeed.telemetry.rundir import read_run
from trainspeed.telemetry.summary import summarize

pytestmark = pytest.mark.timeout(30)


def _steps(n: int, *, data: float, forward: float, backward: float, warm: int = 1, rank: int = 0) -> list[dict]:
    out = []
    for i in range(n):
        phases = {"data": data, "h2d": 0.0, "forward": forward, "backward": backward, "optimizer": 0.001}
        out.append({"schema": 1, "step": i + 1, "t_step": sum(phases.values()), "phases": phases,
                    "samples": 4, "tokens": 128, "loss": 5.0, "syncs": 0, "warmup": i < warm, "rank": rank})
    return out


def test_find_stragglers_needs_ratio_and_absolute_excess():
    assert find_stragglers({0: 0.010, 1: 0.010, 2: 0.010, 3: 0.016}) == {3: pytest.approx(0.6)}
    assert find_stragglers({0: 0.010, 1: 0.0115, 2: 0.010}) == {}           # +15 %: under 20 %
    assert find_stragglers({0: 0.0001, 1: 0.0009}) == {}                     # 16x, but < 1 ms
    assert find_stragglers({0: 0.010, 1: None}) == {}                        # one rank known
    assert find_stragglers({0: 0.010, 1: 0.030}, threshold=0.2) == {1: pytest.approx(2.0)}  # vs the other rank
    # +60 %, 6 ms: but under 5 % of a 200 ms step (the most it could cost the other ranks)
    assert find_stragglers({0: 0.010, 1: 0.016}, step_times={0: 0.2, 1: 0.2}) == {}
    assert find_stragglers({0: 0.010, 1: 0.016}, step_times={0: 0.1, 1: 0.1}) == {1: pytest.approx(0.6)}


def test_rank_figures_exclude_warmup_and_sum_local_phases():
    steps = _steps(5, data=0.002, forward=0.003, backward=0.010)
    steps[0]["t_step"] = 9.0  # warm-up step: ignored
    f = rank_figures(steps)
    assert f["steps"] == 5 and f["measured_steps"] == 4
    assert f["step_time_p50"] == pytest.approx(0.016)
    assert f["local_p50"] == pytest.approx(0.005)
    assert f["data_wait_p50"] == pytest.approx(0.002)
    assert f["data_share"] == pytest.approx(0.002 / 0.016)


def test_rank_table_flags_the_data_starved_rank_with_reason():
    table = rank_table({0: _steps(10, data=0.001, forward=0.004, backward=0.02),
                        1: _steps(10, data=0.001, forward=0.004, backward=0.02),
                        2: _steps(10, data=0.009, forward=0.004, backward=0.012)})
    assert [r["straggler"] for r in table] == [False, False, True]
    assert table[2]["why"] == "own work +160% at 9 of 9 steps; data wait +800% at 9 of 9 steps"
    assert table[2]["excess_s"] == pytest.approx(0.008) and table[0]["excess_s"] is None
    # the same ranks over 6 records (5 measured): too few steps for a verdict
    short = rank_table({0: _steps(6, data=0.001, forward=0.004, backward=0.02),
                        2: _steps(6, data=0.009, forward=0.004, backward=0.012)})
    assert not any(r["straggler"] for r in short)


def _write_run(path, steps_by_rank):
    for r, steps in steps_by_rank.items():
        d = rank_dir(path, r)
        d.mkdir(parents=True, exist_ok=True)
        (d / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    (path / "events.jsonl").write_text(json.dumps({"schema": 1, "type": "run_start", "step": 0, "t_wall": 0.0,
                                                   "data": {"device": "cpu"}}) + "\n")


def test_read_run_summary_report_and_doctor_see_every_rank(tmp_path):
    _write_run(tmp_path, {0: _steps(10, data=0.001, forward=0.004, backward=0.02),
                          1: _steps(10, data=0.012, forward=0.004, backward=0.01, rank=1)})
    (tmp_path / "ranks" / "notarank").mkdir()
    assert list(rank_dirs(tmp_path)) == [1]
    run = read_run(tmp_path)
    assert len(run.steps) == 10 and list(run.rank_steps) == [1] and len(run.rank_steps[1]) == 10
    summary = summarize(run)
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert summary["ranks"][1]["straggler"] and not summary["ranks"][0]["straggler"]
    rows = rank_rows(summary)
    assert rows[1][0] == "1" and rows[1][-1].startswith("YES: ") and rows[0][-1] == "no"
    findings = [f for f in diagnose(run, summary) if f["id"] == "straggler"]
    assert len(findings) == 1
    assert "Straggling rank 1" in findings[0]["title"] and "data wait" in findings[0]["evidence"]
    assert "num_workers" in findings[0]["recommendation"]


def test_single_process_run_has_no_rank_table(tmp_path):
    _write_run(tmp_path, {0: _steps(4, data=0.001, forward=0.004, backward=0.02)})
    summary = summarize(read_run(tmp_path))
    assert summary["ranks"] is None and rank_rows(summary) == []
    assert not [f for f in diagnose(read_run(tmp_path), summary) if f["id"] == "straggler"]
