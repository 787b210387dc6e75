"""The CLI on a full disk: one line and an exit code that says why, never a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trainspeed.cli.main import main
from trainspeed.errors import DiskFullError

pytestmark = pytest.mark.timeout(120)

sys.path.insert(0, str(Path(__file__).parents[1] / "report"))
sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "checkpoint"))
from disk_full import full_disk  # noqa: E402
from report_synth import step_records, write_run  # noqa: E402


def test_report_on_a_full_disk_is_one_line(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = write_run(tmp_path / "a", step_records(40, slowdown_at=None, seed=1))
    with full_disk(run, budget=0):
        rc = main(["report", str(run)])
    err = capsys.readouterr().err
    assert rc == 28
    assert "cannot write" in err and "No space left on device" in err
    assert "Traceback" not in err


def test_a_checkpoint_on_a_full_disk_exits_28(monkeypatch, capsys):
    import trainspeed.cli.train as train_cli

    def full(args):
        raise DiskFullError("/runs/x/checkpoints", 12_000_000, 3_000_000)

    monkeypatch.setattr(train_cli, "run", full)
    assert main(["train", "gpt"]) == 28
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["trainspeed: error: DiskFullError: no space left on /runs/x/checkpoints: 12.0 MB "
                   "needed, 3.0 MB free (the checkpoint was not written; free space there, or point "
                   "checkpoint.dir at a larger disk)"]
