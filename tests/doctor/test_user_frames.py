"""A crash in the user's script printed trainspeed's runner and runpy's frames first
(`.../trainspeed/doctor/runner.py, line 288, in run_doctor`): a newcomer read it as trainspeed
crashing. The printed and recorded traceback now starts at the script's first frame."""

from __future__ import annotations

import json
import os

import pytest

import trainspeed
from trainspeed.cli.main import main
from trainspeed.doctor.user_frames import from_user_frame

pytestmark = pytest.mark.timeout(120)

CRASH = '''
import torch

def build():
    raise ValueError("the user's own bug")

build()
'''


def test_a_crash_in_the_script_is_printed_and_recorded_from_its_first_frame(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(CRASH)
    assert main(["doctor", "--out", str(tmp_path / "r"), "--no-html", "--", "python", "train.py"]) == 1
    err = capsys.readouterr().err
    printed = err[err.index("Traceback (most recent call last):"):]
    assert printed.splitlines()[1].startswith(f'  File "{tmp_path / "train.py"}", line 7, in <module>')
    assert "runner.py" not in printed and "runpy" not in printed
    recorded = json.loads((tmp_path / "r" / "report.json").read_text())["traceback"]
    assert recorded.splitlines()[1].startswith(f'  File "{tmp_path / "train.py"}"')
    assert "ValueError: the user's own bug" in recorded


def test_a_crash_inside_trainspeed_keeps_its_whole_traceback():
    ours = os.path.join(os.path.dirname(trainspeed.__file__), "doctor", "runner.py")
    try:
        exec(compile("raise RuntimeError('ours')", ours, "exec"))
    except RuntimeError as exc:
        tb = exc.__traceback__.tb_next  # the frame 'in' runner.py, as if trainspeed raised alone
    assert tb.tb_frame.f_code.co_filename == ours
    assert from_user_frame(tb) is tb
