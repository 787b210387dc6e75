from __future__ import annotations

import json

import pytest

from doctor_helpers import SCRIPTS, script_findings
from trainspeed.cli.main import main

pytestmark = pytest.mark.timeout(120)


def test_cli_json_report_and_exit_code(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["doctor", "--steps", "12", "--out", str(tmp_path / "r"), "--json", "--",
                 "python", str(SCRIPTS / "item_every_step.py")])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    # the planted cause first among the script's findings (a busy machine adds its own, ranked
    # above an info with nothing at stake on a CPU)
    assert report["kind"] == "doctor" and script_findings(report["findings"])[0]["id"] == "host_syncs"
    assert report["doctor"]["steps"] == 12


def test_cli_module_form_text_report_and_crash_status(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(SCRIPTS)  # `python -m crash` imports from the cwd, as python does
    code = main(["doctor", "--steps", "50", "--out", str(tmp_path / "r"), "--no-html", "--",
                 "python", "-m", "crash", "--crash-at", "6"])
    assert code == 1
    out = capsys.readouterr()
    assert "script crashed after 6 steps" in out.out
    assert "planted crash at step 6" in out.err
    assert json.loads((tmp_path / "r" / "report.json").read_text())["traceback"]


def test_cli_usage_error_is_exit_2(capsys):
    assert main(["doctor", "--", "python", "does_not_exist.py"]) == 2
    assert "not found" in capsys.readouterr().err


def test_cli_profile_steps_writes_a_trace_of_those_steps(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["doctor", "--steps", "8", "--out", str(tmp_path / "r"), "--no-html", "--profile-steps", "4-5",
                 "--", "python", str(SCRIPTS / "healthy.py")])
    assert code == 0
    with open(tmp_path / "r" / "profile_steps_4-5.json") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert {"trainspeed.forward", "trainspeed.backward", "trainspeed.optimizer"} <= names
    assert sorted(n for n in names if n.startswith("trainspeed.step#")) == ["trainspeed.step#4", "trainspeed.step#5"]
    assert f"Profiler trace of steps 4-5: {tmp_path / 'r' / 'profile_steps_4-5.json'}" in capsys.readouterr().out


def test_cli_bad_profile_steps_is_a_usage_error(tmp_path, capsys):
    assert main(["doctor", "--profile-steps", "9-2", "--", "python", str(SCRIPTS / "healthy.py")]) == 2
    assert "START-END" in capsys.readouterr().err
    # a window past the doctor's last step: refused up front, with both ways out (it wrote no
    # trace and said nothing: --steps 20 with 50-55)
    assert main(["doctor", "--steps", "20", "--out", str(tmp_path / "late"), "--profile-steps", "50-55", "--",
                 "python", str(SCRIPTS / "healthy.py")]) == 2
    err = capsys.readouterr().err
    assert "ends after the doctor's last step (--steps 20)" in err
    assert "(--profile-steps 15-20) or run longer (--steps 55)" in err and not (tmp_path / "late").exists()
