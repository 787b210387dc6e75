"""A setting's one-time cost, which the per-step comparison leaves out: compilation.

Trials compare their measured steps, warm-up excluded, so `torch.compile` reads as its steady
speed; the seconds its first steps spend compiling are paid once per run. transformers'
run_clm.py, 200 steps: the tune kept --torch_compile (1.77x with bf16 and workers, verified)
and the tuned command's training took 8.9 s against 5.3 s for the original. The warm-up steps'
wall time of a candidate's trials against its reference's, set against the per-sample gain,
says after how many steps a setting pays for itself.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from trainspeed.tune import stats
from trainspeed.tune.arms import arm_of
from trainspeed.tune.result import Row
from trainspeed.tune.trials import TrialResult

ONE_TIME_MIN_S = 2.0
"""Warm-up seconds over the reference's from which a setting's one-time cost is reported (and
at least as much again as the reference's own warm-up): allocator and thread-pool warm-up
differ by fractions of a second between any two trials."""


def _per_sample(trials: Sequence[TrialResult]) -> float | None:
    """Seconds per sample as the tune's comparisons read them (stats.arm_cost), or None."""
    ok = [t for t in trials if t.ok and t.step_times]
    cost = stats.arm_cost(arm_of(ok)) if ok else math.nan
    return cost if math.isfinite(cost) else None


def _warmup(trials: Sequence[TrialResult]) -> float | None:
    values = [t.warmup_s for t in trials if t.ok and t.warmup_s is not None]
    return statistics.median(values) if values else None


def one_time_cost(reference: Sequence[TrialResult], candidate: Sequence[TrialResult]
                  ) -> tuple[float, int | None] | None:
    """(extra seconds the candidate's warm-up steps took, steps of the reference's size after
    which its per-sample gain pays them back, None without a gain), or None when its warm-up
    cost nothing worth a word."""
    ref_warm, cand_warm = _warmup(reference), _warmup(candidate)
    if ref_warm is None or cand_warm is None:
        return None
    extra = cand_warm - ref_warm
    if extra < max(ONE_TIME_MIN_S, ref_warm):
        return None
    ref_cost, cand_cost = _per_sample(reference), _per_sample(candidate)
    samples = [s for t in reference if t.ok for s in t.samples]
    if ref_cost is None or cand_cost is None or cand_cost >= ref_cost or not samples:
        return extra, None
    per_step_gain = (ref_cost - cand_cost) * statistics.median(samples)
    return extra, int(math.ceil(extra / per_step_gain))


def one_time_text(cost: tuple[float, int | None], won: bool = True) -> str:
    """`won`: the row's verdict is faster. A gain the verdict did not accept pays nothing back,
    as the table's one-time column says ("+7 s, no measured gain pays it back" had beside it
    "pays for itself after ~106 steps")."""
    extra, steps = cost
    text = f"+{extra:.1f} s once (its warm-up steps)"
    if steps and not won:
        return text + ", and no measured gain pays it back"
    return text + (f": pays for itself after ~{steps:,} steps" if steps else ", with no per-step gain")


def note_one_time(row: Row, reference: Sequence[TrialResult], candidate: Sequence[TrialResult]) -> None:
    """Record on `row` (and in its note) what its setting costs once, if anything."""
    row.one_time = one_time_cost(reference, candidate)
    if row.one_time:
        row.note = (row.note + "; " if row.note else "") + one_time_text(row.one_time, row.verdict == stats.FASTER)


def kept_one_time_notes(rows: Sequence[Row], best: dict) -> list[str]:
    """A closing note for each kept setting that pays for itself only after some steps."""
    return [f"{r.knob}={r.setting} costs {one_time_text(r.one_time)}: keep it out of runs shorter than that"
            for r in rows if r.one_time and r.one_time[1] and r.settings
            and all(best.get(k) == v for k, v in r.settings.items())]


__all__ = ["ONE_TIME_MIN_S", "kept_one_time_notes", "note_one_time", "one_time_cost", "one_time_text"]
