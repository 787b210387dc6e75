"""`trainspeed tune ... | tee log` (stdout not a terminal: CI, nohup, a pipe): the tables printed
240 columns wide, garbage in a log viewer or a mail. Now every rich table of the CLI fits
$COLUMNS, else rich_console.PIPE_WIDTH, on the real CLI with its stdout piped."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainspeed.rich_console import PIPE_WIDTH

pytestmark = pytest.mark.timeout(300)  # a tiny tune (~10 s), its resumed rerun, a 20-step doctor

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "assets" / "scripts" / "data_bound.py"


def trainspeed(*argv: str, cwd: Path, columns: str | None) -> str:
    """The CLI's stdout, read through a pipe."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update({"PYTHONPATH": str(ROOT / "src"), "TRAINSPEED_CACHE": str(cwd / "cache"),
                "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")})
    if columns is not None:
        env["COLUMNS"] = columns
    proc = subprocess.run([sys.executable, "-m", "trainspeed", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def too_wide(lines: list[str], width: int) -> list[str]:
    return [line for line in lines if len(line) > width]


def test_the_tune_tables_fit_the_log_width_and_honour_columns(tmp_path):
    shutil.copy(SCRIPT, tmp_path / "train.py")
    tune = ["tune", "--knobs", "threads", "--budget", "1m", "--steps", "6", "--warmup-steps", "1", "--repeats", "1",
            "--verify-repeats", "0", "--max-rounds", "1", "--out", "runs/tune", "--", "python", "train.py"]
    for columns, width in ((None, PIPE_WIDTH), ("90", 90)):  # the second resumes: every trial reused
        out = trainspeed(*tune, cwd=tmp_path, columns=columns).splitlines()
        start = next(i for i, line in enumerate(out) if line.startswith("Ablation:")) - 1
        end = next(i for i, line in enumerate(out) if line.startswith("table: "))
        tables = out[start:end]  # the baseline line, the tables, their notes (progress lines are one line each)
        assert tables[0].startswith("baseline: ") and any("threads" in line for line in tables), out
        assert not too_wide(tables, width), (width, too_wide(tables, width))
        assert any(line.lstrip().startswith("threads ") for line in tables)  # the knob's row, whole


def test_the_doctor_and_report_fit_the_log_width(tmp_path):
    shutil.copy(SCRIPT, tmp_path / "train.py")
    out = trainspeed("doctor", "--steps", "20", "--no-html", "--out", "runs/doc", "--", "python", "train.py",
                     cwd=tmp_path, columns=None).splitlines()
    report = [line for line in out if not line.startswith("trainspeed doctor:")]  # its one status line
    assert any(line.startswith("Findings") for line in report), out
    assert not too_wide(report, PIPE_WIDTH), too_wide(report, PIPE_WIDTH)
    assert max(map(len, report)) > 80  # the log's width, not rich's 80 columns for a pipe
    again = trainspeed("report", "runs/doc", "--no-html", cwd=tmp_path, columns="100").splitlines()
    assert any(line.startswith("Findings") for line in again) and not too_wide(again, 100), too_wide(again, 100)
    assert max(map(len, again)) > 90
