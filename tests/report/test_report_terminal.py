from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from trainspeed.report.load import load_run
from trainspeed.report.terminal import phase_rows, render_terminal, render_terminal_compare, summary_lines

pytestmark = pytest.mark.timeout(120)


def plain_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=120), buf  # a file, not a TTY: rich must write plain text


def test_report_of_a_real_run(run_a):
    lr = load_run(run_a)
    con, buf = plain_console()
    render_terminal(lr.run, lr.summary, lr.findings, console=con)
    out = buf.getvalue()
    assert "\x1b[" not in out  # no ANSI escapes when not a terminal
    assert f"trainspeed report: {run_a.name}" in out
    st = lr.summary["step_time"]
    from trainspeed.report.fmt import fmt_seconds

    assert f"p50 {fmt_seconds(st['p50'])}" in out and f"p99 {fmt_seconds(st['p99'])}" in out
    # The phase table is sorted by share, largest first.
    names = [name for name, _, _ in phase_rows(lr.summary)]
    shares = [lr.summary["phases"][n]["share"] for n in names]
    assert shares == sorted(shares, reverse=True) and len(names) >= 3
    positions = [re.search(rf"│ {n}\s", out).start() for n in names]
    assert positions == sorted(positions)
    # Findings ranked: the critical one first, then warnings by impact.
    i_crit, i_pad, i_log = (out.index(t) for t in ("Training waits for data", "Padding waste", "Logging takes time"))
    assert i_crit < i_pad < i_log
    assert "evidence: data phase is 61% of step time" in out
    assert "do: set num_workers=4" in out
    assert "Notes" not in out  # nothing was skipped


def test_mfu_invalid_and_missing_are_flagged():
    summary = {"mfu": {"value": 1.4, "valid": False, "peak_name": "A100 bf16", "peak_flops": 312e12,
                       "note": "MFU > 100% means the FLOP count or the peak is wrong"}}
    lines = dict(summary_lines(summary))
    assert lines["MFU"] == "invalid: MFU > 100% means the FLOP count or the peak is wrong"
    assert dict(summary_lines({}))["MFU"] == "not measured"
    assert dict(summary_lines({"mfu": {"value": 0.31, "valid": True, "peak_name": "A100 bf16",
                                       "peak_flops": 312e12}}))["MFU"] == "31.0% of peak (A100 bf16, 312 TFLOP/s)"


def test_skipped_lines_are_listed(tmp_path):
    from report_synth import step_records, write_run

    run_dir = write_run(tmp_path / "broken", step_records(40, slowdown_at=None),
                        extra_step_lines=['{"schema": 1, "step": 5', "[1, 2]", '{"schema": 1, "step": 7}'])
    with open(run_dir / "steps.jsonl", "a") as f:
        f.write('{"schema": 1, "step": 99, "t_st')  # a writer killed mid-line
    lr = load_run(run_dir)
    con, buf = plain_console()
    render_terminal(lr.run, lr.summary, lr.findings, console=con)
    out = buf.getvalue()
    assert "4 unreadable record(s) skipped" in out
    assert "not valid JSON" in out and "not a JSON object" in out and "missing t_step" in out
    assert "incomplete last line" in out
    assert "40 (" in out  # the 40 valid steps still render


def test_compare_shows_ratios(run_a, run_b):
    a, b = load_run(run_a), load_run(run_b)
    con, buf = plain_console()
    rows = render_terminal_compare(a, b, console=con)
    out = buf.getvalue()
    assert "\x1b[" not in out
    assert f"A: {run_a.name}" in out and f"B: {run_b.name}" in out
    thr = next(r for r in rows if r["metric"] == "samples/s")
    assert thr["ratio"] == pytest.approx(b.summary["samples_per_s"] / a.summary["samples_per_s"])
    assert f"{thr['ratio']:.2f}" in out and thr["verdict"] in out
    assert f"Findings for B ({run_b.name}): none." in out
