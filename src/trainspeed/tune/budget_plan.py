"""Which knob settings the ablation can pay for: pure arithmetic over the baseline's wall time.

Every round of the ablation runs each candidate `repeats` times and a closing baseline
bracket after every `baseline_every` candidates (order.py); the final verification's reserve is
held back from the start. A setting whose repeats (and the bracket it opens) would end past the
budget is not admitted, and its reason names the budget that would measure it and every setting
above it, in the `--budget` unit users type: a chargpt trial of 37 s (start-up and its first
sample included) left a 4m tune with nothing to measure and the user with no figure to raise
it to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from trainspeed.errors import TuneError
from trainspeed.tune import stats
from trainspeed.tune.result import Row

NOTHING_MEASURED = 3
"""Exit status of a tune that measured no setting (the budget, crashes): not a verdict on the script."""

TRIALS_TO_MEASURE = 8
"""Trials of the baseline's length a tune needs to measure one setting: the baseline, repeats of
the setting with their closing baselines, and the verification's rounds."""


@dataclass
class BudgetPlan:
    base_wall: float
    """Expected wall seconds of one baseline trial."""
    repeats: int
    baseline_every: int
    budget_s: float
    reserve_s: float
    """Held back for the final verification (baseline + best, verify_repeats rounds each)."""
    whole_budget_s: float | None = None
    """The --budget the user gave, where `budget_s` is what is left of it for this plan (the
    first trial paid): a suggested budget is in the user's unit, the whole."""
    planned_s: float = field(init=False)
    """What the admitted settings and their baseline brackets will cost."""
    _wanted_s: float = field(init=False)
    """The same, had every setting offered so far been admitted."""
    _offered: int = 0
    _admitted: int = 0

    def __post_init__(self) -> None:
        self.planned_s = self._wanted_s = self.base_wall * self.repeats  # every round's first bracket

    def admit(self, cost_factor: float, done_repeats: int) -> str | None:
        """None when a setting whose trials cost `cost_factor` baselines each, `done_repeats`
        of them already finished (a resumed tune), fits; else why not. A setting with finished
        trials is always admitted (its figures are reported)."""
        cost = self.base_wall * cost_factor * max(0, self.repeats - done_repeats)
        bracket = self.base_wall * self.repeats  # a group's closing baseline, every round
        self._wanted_s += cost + (bracket if self._offered % self.baseline_every == 0 else 0.0)
        self._offered += 1
        if self._admitted % self.baseline_every == 0:
            cost += bracket  # opens a group
        if not done_repeats and self.planned_s + cost + self.reserve_s > self.budget_s:
            # In --budget's unit: the whole budget, the first trial included, and more than the
            # one given (siamese_network's 4m tune said "--budget 4m measures it": the plan's
            # 236 s, less the first trial, had been counted as if it were the whole)
            whole = self.whole_budget_s if self.whole_budget_s is not None else self.budget_s
            fits = math.ceil((self._wanted_s + self.reserve_s + max(0.0, whole - self.budget_s)) / 60.0)
            fits = max(fits, math.floor(whole / 60.0) + 1) if math.isfinite(whole) else fits
            return (f"does not fit the budget (~{cost:.0f} s for {self.repeats} repeats; --budget {fits}m "
                    "measures it and the settings above it)")
        self.planned_s += cost
        self._admitted += 1
        return None


def budget_note(over_budget: bool, rows: Sequence[Row], budget_s: float) -> str | None:
    """The closing note when not even one more baseline-sized trial fits and a row went
    unmeasured for it. (A tune whose settings were all skipped for other reasons, a DeepSpeed
    config written in the code, spends its budget on the baseline: the note would send the user
    after budget.)"""
    if not over_budget or not any(r.verdict == stats.SKIPPED and "budget" in r.note for r in rows):
        return None
    return (f"the budget ({budget_s:.0f} s) ran out; rows marked 'skipped' were not measured. Rerun with "
            "the same --out and a larger --budget to continue from the finished trials")


class BaselineOutOfBudget(TuneError):
    """The baseline trial did not finish within the whole budget: nothing could be measured,
    and that is the budget's doing, not the script's (the demo's `--budget 25s` on a loaded
    machine said "the baseline trial failed ... fix the config" and exited 2, as for a crash)."""

    exit_code = NOTHING_MEASURED

    def __init__(self, had_s: float):
        fits = max(1, math.ceil(had_s * TRIALS_TO_MEASURE / 60.0))
        super().__init__(
            f"no setting could be measured: the baseline trial did not finish in the {had_s:.0f} s of budget it "
            f"had. A tune needs about {TRIALS_TO_MEASURE} trials at least that long: rerun with --budget {fits}m "
            "or more (or fewer --steps)")


__all__ = ["BaselineOutOfBudget", "BudgetPlan", "NOTHING_MEASURED", "budget_note"]
