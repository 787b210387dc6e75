"""Loss parity judged by the baseline's own noise.

A candidate's loss is compared with the baseline trials of the same length (losses of trials
of different step counts are not comparable), and the tolerance is how much the baseline's
own repeats disagree: their range over their mean, with the tune's `--loss-tolerance` (5 %)
as a floor only where the repeats agree more closely. On an H100 a TF32 trial was refused as
"+12.4 %" on final losses near 1e-6, while the baseline's repeats spread from 2e-6 to 2e-5:
a difference the unchanged script makes by itself is no evidence against the setting.

Settings that cannot change the math (DataLoader workers, pinned memory, prefetching,
persistent workers, compute threads, logging/checkpoint/eval intervals and every what-if) are
never refused for loss: a log-interval what-if read "+10.7 %" while the baselines spread
1.385-1.468, the whole difference being which steps the parity loss happened to average.

A seeded script's repeats agree exactly, and a setting that draws its random numbers
differently (compile's dropout) then differs by more than any relative tolerance once both runs
have converged near zero: pytorch/examples' mnist ended at 0.0022 against 0.00067 (+230 %) from
a start of 2.3. A difference under START_SHARE of the loss the trials started from is how close
to zero two converged runs got, not a worse model, and is not refused.

A loss is also as noisy as the per-step losses its tail averaged: a seeded script's repeats
agree exactly, yet any numeric change runs other batches' noise through the tail (dcgan seeded:
bf16's generator loss +8 % with per-step losses swinging by far more). The tolerance also
covers SCATTER_Z standard errors of the two sides' tail means (tail_noise).

A script that steps several optimizers (a GAN's optimizerD and optimizerG) has a loss per
optimizer, and the trial's `loss` is only the primary's: on dcgan, D's. Compared alone, a setting
that broke the generator passed on the discriminator's loss. judge_each judges each optimizer's
own loss the trials recorded (optimizer_losses.py) by the rules above, each against the
baseline's own spread of that loss, and the note names the one that failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterable

from trainspeed.tune import stats
from trainspeed.tune.arms import fmt_loss, mean_loss
from trainspeed.tune.script_knobs import WHATIF_PREFIX
from trainspeed.tune.trials import TrialResult

MATH_FREE_KNOBS = frozenset({
    "num_workers", "persistent_workers", "prefetch_factor", "pin_memory", "threads", "torch_threads",
    "log_every", "checkpoint_every", "eval_every", "no_gc",
})
"""Knobs whose settings change where or when the same arithmetic runs, never the arithmetic."""

START_SHARE = 0.01
"""A final-loss difference under this share of the baseline's starting loss is not a mismatch."""
SCATTER_Z = 3.0
"""Standard errors of the two tails' difference a candidate's loss may be worse by before it is
refused (tail_noise): a refused winner is a lost speedup, so the bar is high."""

def math_free(settings: dict[str, Any], knob_of: dict[str, str]) -> bool:
    """Whether every setting belongs to a math-free knob (`knob_of`: setting key -> the knob
    that offered it) or is a what-if. The empty settings (the baseline) are not."""
    return bool(settings) and all(key.startswith(WHATIF_PREFIX) or knob_of.get(key) in MATH_FREE_KNOBS
                                  for key in settings)


def same_length(baseline: list[TrialResult], candidate: list[TrialResult]) -> list[TrialResult]:
    """The baseline trials that ran as many steps as the candidate's (none when no baseline
    trial did: the parity check then has nothing to compare with; all when the step counts
    are unknown). The script tuner's first baseline is a shorter
    pricing run (word_language_model: 30 steps, loss 7.126, against 6.585 after the 124 steps
    of every later trial): averaged in, it read bf16 as -2.1 % for final losses 0.14 % apart."""
    lengths = {c.steps_run for c in candidate if c.steps_run}
    ok = [b for b in baseline if b.ok]
    if lengths and any(b.steps_run for b in ok):
        return [b for b in ok if b.steps_run in lengths]  # none: losses of other lengths are not compared
    return ok


def baseline_spread(losses: Iterable[float | None]) -> float:
    """How far the baseline's repeats disagree: (max - min) / |mean| of their finite losses
    (0 with fewer than two)."""
    xs = [x for x in losses if x is not None and math.isfinite(x)]
    if len(xs) < 2:
        return 0.0
    mean = sum(xs) / len(xs)
    return (max(xs) - min(xs)) / max(abs(mean), 1e-12)


@dataclass(frozen=True, slots=True)
class Parity:
    """One comparison's loss parity."""

    base_loss: float | None
    cand_loss: float | None
    delta: float | None
    """(candidate - baseline) / |baseline|, as the table shows it."""
    tolerance: float
    spread: float
    """How far the baseline's same-length repeats disagree (baseline_spread)."""
    math_free: bool
    start: float | None = None
    """The baseline's mean starting loss (TrialResult.loss_start), the scale of the task's loss."""
    optimizer: str | None = None
    """Whose loss this is, where the script steps several optimizers (optimizerG); None: the
    script's one loss, and the notes read as they always did."""
    scatter: float = 0.0
    """SCATTER_Z standard errors of the difference the two sides' tails' per-step scatter allows
    (tail_noise): where the repeats cannot tell it, as a seeded script's cannot."""

    @property
    def near_zero(self) -> bool:
        """Both losses finite and closer than START_SHARE of the starting loss."""
        return (self.start is not None and self.base_loss is not None and self.cand_loss is not None
                and math.isfinite(self.start) and math.isfinite(self.cand_loss)
                and abs(self.cand_loss - self.base_loss) < START_SHARE * abs(self.start))

    @property
    def judged(self) -> float | None:
        """The delta the verdict weighs: none for a math-free setting, unless its loss is not
        finite (a crash of the arithmetic is never the noise's)."""
        if (self.math_free or self.near_zero) and self.delta is not None and math.isfinite(self.delta):
            return None
        return self.delta

    def near_zero_note(self) -> str | None:
        """Why a loss delta beyond the tolerance was not refused: both runs converged near zero."""
        if not (self.near_zero and self.delta is not None and abs(self.delta) > self.tolerance):
            return None
        return (f"{self._whose}loss {fmt_loss(self.cand_loss)} vs baseline {fmt_loss(self.base_loss)}: both near zero, "
                f"apart by under {START_SHARE:.0%} of the loss the trials started from ({fmt_loss(self.start)}); "
                "not refused")

    def note(self) -> str:
        why = ("the baseline's own repeats spread" if self.spread >= self.tolerance else
               f"{SCATTER_Z:g} standard errors of the per-step losses the two sides averaged"
               if self.scatter >= self.tolerance
               else f"the floor; the baseline's repeats spread {self.spread:.1%}")
        return (f"{self._whose}loss {fmt_loss(self.cand_loss)} vs baseline {fmt_loss(self.base_loss)}: beyond a "
                f"tolerance of {self.tolerance:.1%} ({why})")

    @property
    def failed(self) -> bool:
        """Whether this loss refuses the setting (worse beyond the tolerance, or not finite)."""
        return not stats.loss_ok(self.judged, self.tolerance)

    @property
    def _whose(self) -> str:
        return f"{self.optimizer}'s " if self.optimizer else ""


def judge(baseline: list[TrialResult], candidate: list[TrialResult], floor: float, free: bool = False,
          optimizer: str | None = None) -> Parity:
    """A comparison's parity: the baseline's same-length trials' mean loss against the
    candidate's, with the spread-scaled tolerance; `free`: the setting cannot change the math."""
    base = same_length(baseline, candidate)
    base_loss, cand_loss = mean_loss(base), mean_loss(candidate)
    spread = baseline_spread(r.loss for r in base)
    scatter = tail_noise(base, candidate)
    starts = [r.loss_start for r in base if r.loss_start is not None and math.isfinite(r.loss_start)]
    return Parity(base_loss=base_loss, cand_loss=cand_loss, delta=stats.loss_delta(base_loss, cand_loss),
                  tolerance=max(floor, spread, scatter), spread=spread, math_free=free,
                  start=sum(starts) / len(starts) if starts else None, optimizer=optimizer, scatter=scatter)


def tail_noise(baseline: list[TrialResult], candidate: list[TrialResult]) -> float:
    """SCATTER_Z standard errors of the relative difference of the two sides' parity losses, from
    each trial's tail scatter (TrialResult.loss_scatter): 0 where either side has none. The
    repeats of one side are not counted as independent draws (a seeded script's repeat the same
    batches), so a side's error is its trials' typical one, not that over sqrt(repeats)."""
    def typical(results: list[TrialResult]) -> float | None:
        xs = [r.loss_scatter for r in results if r.loss_scatter is not None and math.isfinite(r.loss_scatter)]
        return math.sqrt(sum(x * x for x in xs) / len(xs)) if xs else None

    b, c = typical(baseline), typical(candidate)
    return SCATTER_Z * math.hypot(b, c) if b is not None and c is not None else 0.0


@dataclass(frozen=True, slots=True)
class Parities:
    """A comparison's parity over every optimizer's own loss (a GAN's optimizerD and optimizerG):
    the primary's (`loss`, judged as for one optimizer), then each other one's, each against its
    own baseline spread. A setting that keeps D's loss and breaks G's fails on G's. Read as a
    Parity: the figures and the verdict are the first failing loss's, else the primary's."""

    primary: Parity
    others: tuple[Parity, ...] = ()

    @property
    def failing(self) -> list[Parity]:
        return [p for p in (self.primary, *self.others) if p.failed]

    @property
    def deciding(self) -> Parity:
        """The loss the table shows and the verdict weighs: the first that fails, else the primary's."""
        return next(iter(self.failing), self.primary)

    @property
    def delta(self) -> float | None:
        return self.deciding.delta

    @property
    def judged(self) -> float | None:
        return self.deciding.judged

    @property
    def tolerance(self) -> float:
        return self.deciding.tolerance

    @property
    def deltas(self) -> dict[str, float | None]:
        """Each optimizer's own loss delta, by name; empty with one optimizer."""
        named = [p for p in (self.primary, *self.others) if p.optimizer]
        return {p.optimizer: p.delta for p in named} if self.others else {}

    def note(self) -> str:
        """Every failing loss, named (the primary's first)."""
        return "; ".join(p.note() for p in self.failing) or self.primary.note()

    def near_zero_note(self) -> str | None:
        return "; ".join(n for p in (self.primary, *self.others) if (n := p.near_zero_note())) or None


def own_loss(results: list[TrialResult], name: str) -> list[TrialResult]:
    """The trials as `name`'s own loss: copies whose loss and starting loss are that optimizer's
    (None where a trial recorded none of it: nothing to compare, as a trial without a loss)."""
    return [replace(r, loss=r.optimizer_losses.get(name), loss_start=r.optimizer_loss_starts.get(name),
                    loss_scatter=r.optimizer_loss_scatters.get(name)) for r in results]


def judge_each(baseline: list[TrialResult], candidate: list[TrialResult], floor: float,
               free: bool = False) -> Parities:
    """judge() over the primary's loss and each other optimizer's the trials recorded, in the
    order the baseline named them. A trial with one optimizer records none: exactly judge()."""
    trials = [*baseline, *candidate]
    primary = next((r.loss_optimizer for r in trials if r.loss_optimizer), None)
    names = list(dict.fromkeys(name for r in trials for name in r.optimizer_losses if name != primary))
    others = tuple(judge(own_loss(baseline, name), own_loss(candidate, name), floor, free, optimizer=name)
                   for name in names)
    return Parities(primary=judge(baseline, candidate, floor, free, optimizer=primary if names else None),
                    others=others)


def unmoved_loss_note(baseline: list[TrialResult]) -> str | None:
    """Why the loss column proves nothing, or None: the baseline trials' loss ended where it
    started (within START_SHARE). nanoGPT's trials of 12 steps sat inside its learning-rate
    warm-up, every trial ending at 4.434146 whatever its setting, and word_language_model's at
    ln(vocab): the table's "+0.0%" read as parity checked."""
    pairs = [(r.loss_start, r.loss) for r in baseline if r.ok and r.loss_start is not None and r.loss is not None
             and math.isfinite(r.loss_start) and math.isfinite(r.loss)]
    if not pairs or any(abs(end - start) >= START_SHARE * abs(start) for start, end in pairs):
        return None
    start, end = pairs[0]
    return (f"the baseline's loss did not move within its trials ({fmt_loss(start)} at their first steps, "
            f"{fmt_loss(end)} at their end): the loss column cannot tell a setting that harms training from one "
            "that does not; a larger --steps lets the loss move")


__all__ = ["MATH_FREE_KNOBS", "SCATTER_Z", "START_SHARE", "Parities", "Parity", "baseline_spread", "judge", "judge_each",
           "unmoved_loss_note",
           "math_free", "own_loss", "same_length", "tail_noise"]
