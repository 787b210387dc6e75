from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trainspeed.cli.main import main

pytestmark = pytest.mark.timeout(180)

sys.path.insert(0, str(Path(__file__).parents[1] / "report"))
from report_synth import step_records, write_run  # noqa: E402

FINDING = {"id": "data_bound", "severity": "critical", "title": "Training waits for data",
           "evidence": "data is 40% of step time", "recommendation": "num_workers=4",
           "verify_with": None, "impact": 0.4}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    a = write_run(root / "a", step_records(60, slowdown_at=None, seed=1), findings=[FINDING])
    fast = step_records(60, slowdown_at=None, seed=2)
    for r in fast:  # B: data phase gone, same everything else
        r["t_step"] -= r["phases"]["data"]
        r["phases"]["data"] = 0.0
    b = write_run(root / "b", fast)
    return a, b


def test_report_terminal_and_html(runs, capsys):
    a, _ = runs
    pytest.importorskip("matplotlib")
    assert main(["report", str(a)]) == 0
    out = capsys.readouterr().out
    assert "trainspeed report: a" in out and "Training waits for data" in out
    assert "\x1b[" not in out
    assert (a / "report.html").stat().st_size > 10_000


def test_report_of_the_current_directory_names_it(runs, capsys, monkeypatch):
    a, _ = runs
    monkeypatch.chdir(a)
    assert main(["report", ".", "--no-html"]) == 0
    assert "trainspeed report: a " in capsys.readouterr().out


def test_report_no_html_and_custom_path(runs, tmp_path, capsys):
    _, b = runs
    assert main(["report", str(b), "--no-html"]) == 0
    assert not (b / "report.html").exists()
    capsys.readouterr()
    pytest.importorskip("matplotlib")
    target = tmp_path / "sub" / "r.html"
    assert main(["report", str(b), "--html", str(target)]) == 0
    assert target.exists() and "HTML report:" in capsys.readouterr().out


def test_report_json(runs, capsys):
    a, _ = runs
    assert main(["report", str(a), "--json", "--no-html"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["steps"] == 60
    assert doc["findings"][0]["id"] == "data_bound"
    assert doc["skipped"] == []


def test_compare_cli(runs, capsys):
    a, b = runs
    assert main(["report", str(a), "--compare", str(b), "--json", "--no-html"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {(r["group"], r["metric"]): r for r in doc["compare"]}
    sa, sb = doc["a"]["summary"], doc["b"]["summary"]
    assert rows[("throughput", "samples/s")]["ratio"] == pytest.approx(sb["samples_per_s"] / sa["samples_per_s"])
    assert rows[("throughput", "samples/s")]["ratio"] > 1.1  # B dropped the data phase
    assert rows[("phase", "data")]["b"] == 0.0
    pytest.importorskip("matplotlib")
    assert main(["report", str(a), "--compare", str(b)]) == 0
    out = capsys.readouterr().out
    assert "x faster" in out and "B/A" in out
    assert (b / "compare.html").exists()


def test_not_a_run_dir(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "RunDirError" in capsys.readouterr().err


def test_report_starts_without_torch(runs):
    """Rendering a run directory reads JSON and draws plots: torch's import (1.4 s of the
    2.6 s a report took) came in through the doctor's DeepSpeed check and is gone."""
    import subprocess

    a, _ = runs
    code = ("import sys; from trainspeed.cli.main import main; rc = main(['report', sys.argv[1], '--no-html']); "
            "print('TORCH', 'torch' in sys.modules); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, str(a)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Training waits for data" in proc.stdout
    assert proc.stdout.rstrip().endswith("TORCH False")


def test_report_into_a_closed_pipe_exits_quietly(runs):
    """`trainspeed report RUN --json | head -c 400` ended with a BrokenPipeError traceback: a
    reader that stops early is no error of the report's, and is met quietly, as other CLIs do."""
    import os
    import subprocess

    a, _ = runs
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: every write is EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "trainspeed", "report", str(a), "--json"], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 1
