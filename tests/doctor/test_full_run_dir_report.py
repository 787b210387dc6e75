"""The doctor whose run directory fills up: the script runs to its own exit code, the report of
the steps recorded is still printed (also with --json, where report.json could not be written),
no temp file is left, and the last lines say what the run directory lacks and what to do.
ENOSPC is simulated (no root, no tmpfs); the same run on a 40 kB tmpfs read the same."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest

from trainspeed.cli.main import main

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "checkpoint"))
from disk_full import full_disk  # noqa: E402
from doctor_helpers import step_records_fill_after  # noqa: E402

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
import sys, torch
from torch import nn
torch.manual_seed(0)
model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(40):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
sys.exit(3)
"""


@pytest.fixture
def filling(tmp_path, monkeypatch):
    """The run directory's disk is full after the first step records: step records, report.json
    and report.html all fail with ENOSPC."""
    from trainspeed.fileio import atomic_write_text
    from trainspeed.telemetry import jsonfile, rundir

    step_records_fill_after(monkeypatch, 6)

    def full(path, *a, **k):
        if str(path).startswith(str(tmp_path / "run")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return atomic_write_text(path, *a, **k)

    monkeypatch.setattr(jsonfile, "atomic_write_text", full)
    monkeypatch.setattr(rundir, "_TOLD", {})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    with full_disk(tmp_path / "run", budget=0):  # report.html (written through open())
        yield tmp_path / "run"


def test_json_on_a_full_disk_still_prints_the_report_and_keeps_the_exit_code(filling, capsys):
    """It raised FileNotFoundError for report.json, with a traceback and exit code 1."""
    code = main(["doctor", "--json", "--steps", "0", "--log-every", "2", "--out", str(filling), "--",
                 "python", "train.py"])
    out, err = capsys.readouterr()
    assert code == 3, err  # the script's own
    report = json.loads(out)
    assert report["kind"] == "doctor" and report["doctor"]["exit_code"] == 3
    assert "Traceback" not in err
    assert not (filling / "report.json").exists()
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"trainspeed doctor: the run directory {filling} could not be written (No space "
                           "left on device): its step records stop at step "), last
    assert "report.json was not written" in last and "run the doctor again" in last


def test_text_on_a_full_disk_prints_the_doctors_report_and_leaves_no_temp_file(filling, capsys):
    pytest.importorskip("matplotlib")
    code = main(["doctor", "--steps", "0", "--log-every", "2", "--out", str(filling), "--", "python", "train.py"])
    out, err = capsys.readouterr()
    assert code == 3
    assert "trainspeed report: run" in out and "script exited with status 3" in out
    assert "trainspeed doctor: report.html not written: No space left on device" in err, err
    assert "report rendering failed" not in err and "Traceback" not in err
    assert "could not be written (No space left on device)" in err.strip().splitlines()[-1]
    assert not [p.name for p in filling.iterdir() if p.name.startswith(".")]
