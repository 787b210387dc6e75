from __future__ import annotations

import json

import pytest

from conftest import SCRIPTS
from trainspeed.cli.main import main

pytestmark = pytest.mark.timeout(120)


def test_cli_json_report_and_exit_code(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["doctor", "--steps", "12", "--out", str(tmp_path / "r"), "--json", "--",
                 "python", str(SCRIPTS / "item_every_step.py")])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "doctor" and report["findings"][0]["id"] == "host_syncs"
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
