"""The budget a tune has left once its answer is verified, spent on the settings the budget plan
skipped: one round each (the setting between two fresh baseline trials) while a round fits.

The plan prices a setting's trials before any ran, and the rounds after the ablation hold the
verification's reserve back while a setting may win (spend.py). Both are guesses: the verified
best ran faster than a baseline trial, or no winner needed a verification at all. A nanoGPT tune
(default 10m) skipped compile, "does not fit the budget (~198 s for 2 repeats ...)", and ended
at 398 s of 600 s with no word on the 209 s left. Here a skipped setting gets its round from
what is left, and where none fits, the closing note says how much was left and why.
"""

from __future__ import annotations

from typing import Any

from trainspeed.tune import stats
from trainspeed.tune.knobs import Candidate
from trainspeed.tune.result import Row
from trainspeed.tune.spend import LATE_REPEAT, fresh_round
from trainspeed.tune.verify import unverified_answer

Tuner = Any
"""search.Tuner, which imports this module."""

LATE_NOTE = "measured in one round with the budget left after the verification, not combined with other settings"


def _skipped_for_budget(tuner: Tuner, ablation: list[Row]) -> list[tuple[int, Candidate]]:
    """(row index, setting) of the ablation rows the budget left unmeasured."""
    offered = {(c.knob, c.label): c for c in tuner.unadmitted}
    return [(i, offered[(r.knob, r.setting)]) for i, r in enumerate(ablation)
            if r.verdict == stats.SKIPPED and r.speedup is None and (r.knob, r.setting) in offered]


def _round_price(tuner: Tuner, c: Candidate) -> float:
    """One round: the setting's trial and the baseline trial on either side (B C B)."""
    return tuner._price(tuner.key(c.settings)) + 2 * tuner.base_wall


def measure_left(tuner: Tuner, ablation: list[Row], final: Row | None,
                 best: dict[str, Any]) -> tuple[Row | None, dict[str, Any], str | None]:
    """Rounds for the settings skipped for the budget while one fits what is left (their rows
    replaced in `ablation`); the answer, which a setting measured here replaces where it reads
    faster beyond the noise and faster than the answer (unverified, said so); and the closing
    note where a skipped setting still went unmeasured with budget left."""
    unmeasured: list[Candidate] = []
    for i, c in _skipped_for_budget(tuner, ablation):
        left = tuner.opt.budget_s - tuner.spent
        if _round_price(tuner, c) > left:
            unmeasured.append(c)
            continue
        key = tuner.key(c.settings)
        tuner.cost_factor.setdefault(key, c.cost_factor)
        tuner.knob_of_config.setdefault(key, c.knob)
        tuner.next_repeat.setdefault(key, LATE_REPEAT)
        # fresh baseline trials around it: the verification took the baseline's repeats from
        # next_repeat without moving it on (numbered from what this tune ran: a resumed tune
        # finds the same ones in its store)
        base = tuner.key({})
        tuner.next_repeat[base] = max([tuner.next_repeat.get(base, tuner.opt.repeats)]
                                      + [r.repeat + 1 for r in tuner.results({}) if (base, r.repeat) in tuner.ran])
        tuner.say(f"one round of {c.knob}={c.label} with the budget left ({left:.0f} s)")
        pairs: list[list[tuple[tuple[int, ...], int]]] = [[]]
        fresh_round(tuner, [c], [0], pairs, 0)
        row = tuner.row(c.knob, c.label, c.settings, {}, cost_factor=c.cost_factor, pairs=pairs[0])
        if row.speedup is None:
            unmeasured.append(c)  # the round did not finish (the budget's end, a crash): row as it was
            continue
        row.note = f"{row.note}; {LATE_NOTE}" if row.note else LATE_NOTE
        ablation[i] = row
        final, best = _answer(tuner, row, final, best)
    return final, best, _note(tuner, unmeasured)


def _answer(tuner: Tuner, row: Row, final: Row | None, best: dict[str, Any]) -> tuple[Row | None, dict[str, Any]]:
    """The faster of the answer and a setting measured late (the tune answers with the fastest
    config it measured): that setting alone, unverified, where it reads faster beyond the noise."""
    answered = final.speedup if final is not None and final.verdict == stats.FASTER and best else 1.0
    if row.verdict != stats.FASTER or tuner.is_whatif(row.settings) or (row.speedup or 0.0) <= (answered or 1.0):
        return final, best
    return unverified_answer(tuner, row, f"{row.knob}={row.setting} as measured in one round after the verification, "
                                         "faster than the verified answer; rerun with the same --out and a larger "
                                         "--budget to combine and verify it")


def _note(tuner: Tuner, unmeasured: list[Candidate]) -> str | None:
    left = tuner.opt.budget_s - tuner.spent
    if not unmeasured or tuner._over_budget():
        return None  # not one more trial fits: budget_plan.budget_note says the budget ran out
    names = ", ".join(f"{c.knob}={c.label} (~{_round_price(tuner, c):.0f} s)" for c in unmeasured)
    return (f"the tune ended with {left:.0f} s of its {tuner.opt.budget_s:.0f} s budget left: one round of {names}, "
            "its trial with the baseline trials around it, needs more than that; rerun with the same --out and a "
            "larger --budget to measure it")


__all__ = ["LATE_NOTE", "measure_left"]
