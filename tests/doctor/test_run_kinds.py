"""Who wrote a run, and which verify command its user can run (doctor/checks/run_kinds.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainspeed.doctor.checks.run_kinds import as_diagnosed, runnable_verify, script_command
from trainspeed.telemetry.rundir import RunData

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("argv, expected", [
    (["python", "train.py", "--lr", "3"], ["python", "train.py", "--lr", "3"]),
    ([".venv/bin/python", "-m", "pkg.train", "x"], [".venv/bin/python", "-m", "pkg.train", "x"]),
    (["python", "-c", "import x"], None),
    (["python", "-m", "pytest", "tests"], None),
    (["python", "-m", "ipykernel_launcher", "-f", "k.json"], None),
    (["python"], None),
    (None, None),
])
def test_script_command(argv, expected):
    assert script_command(argv) == expected


def _run(config=None, argv=None, **extra) -> RunData:
    events = [{"type": "run_start", "data": {"argv": argv}}] if argv else []
    return RunData(path=Path("runs/r"), config=config or {}, events=events, **extra)


def _finding(verify, rec="DataLoader(..., num_workers=1) (engine: data.num_workers=1)"):
    return {"id": "data_bound", "recommendation": rec, "verify_with": verify}


def test_a_monitor_script_is_diagnosed_as_that_script():
    run = as_diagnosed(_run(argv=["python", "train.py", "--fast"]))
    assert run.config == {"command": ["python", "train.py", "--fast"]}
    assert as_diagnosed(_run(argv=["python", "-c", "pass"])).config == {}
    engine = {"recipe": {"name": None}, "data": {}}
    assert as_diagnosed(_run(config=engine, argv=["python", "train.py"])).config is engine


def test_verify_commands_are_runnable_for_each_kind_of_run():
    tune = "trainspeed tune runs/r/config.yaml --knobs num_workers"
    # an engine run of a recipe: `trainspeed tune CONFIG` rebuilds the model
    assert runnable_verify(_run(config={"recipe": {"name": "gpt"}}), [_finding(tune)])[0]["verify_with"] == tune
    # a Trainer on the user's own model: compare with a re-run that sets the engine setting
    (got,) = runnable_verify(_run(config={"recipe": {"name": None}}), [_finding(tune)])
    assert got["verify_with"] == "trainspeed report runs/r --compare NEW_RUN_DIR (after re-running with data.num_workers=1)"
    # a Monitor in a notebook: no config is claimed, nor a made-up script
    (got,) = runnable_verify(_run(), [_finding("trainspeed tune CONFIG.yaml --knobs num_workers")])
    assert got["verify_with"] == "trainspeed report runs/r --compare NEW_RUN_DIR (after the change)"
    (got,) = runnable_verify(_run(), [_finding("trainspeed doctor -- python train.py (on a quiet machine)")])
    assert got["verify_with"] == "trainspeed report runs/r --compare NEW_RUN_DIR (after re-running on a quiet machine)"
    # a script run keeps its commands
    script = "trainspeed tune --knobs num_workers -- python train.py"
    assert runnable_verify(_run(config={"command": ["python", "train.py"]}), [_finding(script)])[0]["verify_with"] == script
