"""A long doctor run says how far it is, on a terminal only (doctor/instrument/progress.py)."""

from __future__ import annotations

import io

import pytest

from trainspeed.doctor.instrument.progress import DoctorProgress, progress_for

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_line_after_thirty_seconds_then_each_minute_with_the_time_to_go():
    out, clock = io.StringIO(), Clock()
    progress = DoctorProgress(200, out, clock)
    for step in range(1, 201):  # the first step ends at 5 s (imports, setup), then 2.25 s a step
        clock.t = 5.0 + 2.25 * (step - 1)
        progress(step)
    lines = out.getvalue().splitlines()
    assert lines[0] == "trainspeed doctor: step 13 of 200, 2.25 s a step, ~7 min to go"  # first at >= 30 s
    assert len(lines) == 7  # then one a minute over the 7.5 minutes
    assert lines[-1] == "trainspeed doctor: step 175 of 200, 2.25 s a step, ~56 s to go"


def test_a_short_run_or_no_terminal_prints_nothing():
    out, clock = io.StringIO(), Clock()
    progress = DoctorProgress(None, out, clock)
    for step in range(1, 50):
        clock.t = 0.5 * step
        progress(step)
    assert out.getvalue() == ""  # 25 s in all
    assert progress_for(200, io.StringIO()) is None  # a pipe or a file: a tune's trials, CI logs
