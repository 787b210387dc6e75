"""A hopeful (a setting given more rounds because its first ones read faster) that no later round
could be run for: its row said 'the 0 rounds after its first 2 read not measured, not beyond the
noise (10%)' (slow_images.py's threads=1 at 1.34x in a 6m tune). It now says the budget left it
unconfirmed and how to confirm it; a hopeful whose own rounds read too little still says so."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainspeed.tune import stats
from trainspeed.tune.result import Row
from trainspeed.tune.spend import confirm
from trainspeed.tune.trials import TrialResult

pytestmark = pytest.mark.timeout(30)


def _tuner(rounds):
    return SimpleNamespace(chosen_after={"threads=1": 2}, key=lambda s: "threads=1",
                           _paired=lambda settings, base, pairs: (rounds, 0), round_logs={},
                           opt=SimpleNamespace(min_effect=0.03))


def _row():
    return Row(knob="threads", setting="1", settings={"threads": 1}, verdict=stats.FASTER,
               speedup=1.34, ci=(1.27, 1.42), noise=0.10)


def test_a_hopeful_with_no_round_of_its_own_is_unconfirmed_for_the_budget():
    row = _row()
    confirm(_tuner([]), row, [[], [], []])
    assert row.verdict == stats.NO_CHANGE
    assert row.note.startswith("unconfirmed: no round after the first 2 that chose it fit the budget; "
                               "rerun with the same --out and a larger --budget to confirm it")
    assert "0 rounds" not in row.note and "not measured" not in row.note


def test_a_hopeful_whose_own_rounds_read_no_gain_says_what_they_read():
    def trial(step_s):
        return TrialResult(key="k", label="l", repeat=0, ok=True, step_times=[step_s] * 8, samples=[16.0] * 8)
    row = _row()
    confirm(_tuner([([trial(1.0)], trial(1.0)), ([trial(1.0)], trial(0.99))]), row, [[], [], []])
    assert row.verdict == stats.NO_CHANGE
    assert row.note.startswith("the 2 rounds after its first 2 read 1.01x, not beyond the noise (3%)")
