"""Pure statistics of the tuner: per-sample cost of a trial, speedup with a confidence
interval, and the verdict a knob setting earns.

Nothing here runs a trial or reads a file; every function maps numbers to numbers, so the
verdict rules are unit-tested on synthetic samples (a fast knob, a slow one, a noisy one).

The cost of a trial is *seconds per sample*: the mean step time without the slowest 5 % of
steps (robust to the odd step a neighbouring process steals, yet it counts the periodic waits
of a loader that falls behind, which a median hides) divided by the mean samples per step.
Per sample, not per step, because knobs such as batch size and length bucketing change how many samples a step holds.

An epoch's first step pays for the epoch's start (a new loader iterator; worker processes
started again unless persistent_workers), once per epoch. A trial that saw such a step counts
its extra time (over the trial's regular steps) once per `steps_per_epoch` steps, as a whole
run does: not as one of 25 steps (it would weigh 2x for a 50-step epoch), and not trimmed
away as a stolen step (persistent_workers would never show).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

FASTER = "faster"
SLOWER = "slower"
NO_CHANGE = "no measurable change"
LOSS_MISMATCH = "loss mismatch"
FAILED = "failed"
SKIPPED = "skipped"
BUSY = "not measurable while the machine is busy"
"""A winner whose trials and reference trials saw different load from other processes (load_proof.py)."""
VERDICTS = (FASTER, SLOWER, NO_CHANGE, LOSS_MISMATCH, FAILED, SKIPPED, BUSY)


@dataclass(frozen=True, slots=True)
class Arm:
    """The measured steps of one setting, pooled over its repeats (interleaved trials)."""

    step_times: tuple[np.ndarray, ...]
    """Per repeat: step times (s) of the measured (post-warm-up) steps."""
    samples: tuple[np.ndarray, ...]
    """Per repeat: samples per measured step, aligned with step_times."""
    epoch_starts: tuple[np.ndarray, ...] = ()
    """Per repeat: True where a measured step was an epoch's first (empty: none known)."""
    steps_per_epoch: float | None = None
    """Steps per epoch of this setting (None: unknown, epoch starts are not amortized)."""

    @classmethod
    def of(cls, step_times: Sequence[Sequence[float]], samples: Sequence[Sequence[float]],
           epoch_starts: Sequence[Sequence[bool]] | None = None, steps_per_epoch: float | None = None) -> "Arm":
        t = tuple(np.asarray(x, dtype=np.float64) for x in step_times)
        s = tuple(np.asarray(x, dtype=np.float64) for x in samples)
        if len(t) != len(s) or any(a.shape != b.shape for a, b in zip(t, s)):
            raise ValueError("step_times and samples must have the same shape per repeat")
        e: tuple[np.ndarray, ...] = ()
        if epoch_starts is not None and any(len(x) for x in epoch_starts):
            e = tuple(np.asarray(x, dtype=bool).reshape(-1) if len(x) else np.zeros(len(a), bool)
                      for x, a in zip(epoch_starts, t))
            if len(e) != len(t) or any(a.shape != b.shape for a, b in zip(t, e)):
                raise ValueError("epoch_starts must have the same shape as step_times per repeat")
        return cls(step_times=t, samples=s, epoch_starts=e, steps_per_epoch=steps_per_epoch)

    @property
    def repeats(self) -> int:
        return len(self.step_times)

    def starts(self, i: int) -> np.ndarray | None:
        """Repeat i's epoch-start mask, or None when there is nothing to amortize."""
        return self.epoch_starts[i] if self.epoch_starts and self.steps_per_epoch else None

    def pooled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if not self.step_times:
            return np.array([]), np.array([]), None
        starts = np.concatenate(self.epoch_starts) if self.epoch_starts and self.steps_per_epoch else None
        return np.concatenate(self.step_times), np.concatenate(self.samples), starts


# Share of the slowest steps left out of a trial's mean step time.
SLOW_TRIM = 0.05


def trimmed_step_time(step_times: np.ndarray) -> float:
    """Mean step time without the slowest SLOW_TRIM share of steps.

    Not the median: a loader worker that falls behind makes every few steps wait, and the
    median hides exactly those waits (a tuned num_workers=1 read 1.63x by the median and 1.23x
    by samples/s). Trimming only the slowest 5 % still keeps one step stolen by another process
    from deciding a trial."""
    t = np.sort(step_times)
    drop = max(1, round(len(t) * SLOW_TRIM)) if len(t) > 1 else 0
    return float(np.mean(t[:len(t) - drop]))


def cost_per_sample(step_times: np.ndarray, samples: np.ndarray, epoch_starts: np.ndarray | None = None,
                    steps_per_epoch: float | None = None) -> float:
    """Seconds per sample: trimmed mean step time / mean samples per step (NaN when empty).

    With `epoch_starts` (a mask of epoch-first steps) and `steps_per_epoch`, those steps are
    left out of the mean and their extra time over it is added once per epoch instead."""
    ok = np.isfinite(step_times) & np.isfinite(samples) & (samples > 0)
    if epoch_starts is None or not steps_per_epoch or not (ok & epoch_starts).any():
        return float(trimmed_step_time(step_times[ok]) / np.mean(samples[ok])) if ok.any() else math.nan
    regular = ok & ~epoch_starts
    if not regular.any():
        return math.nan
    step = trimmed_step_time(step_times[regular])
    extra = float(np.mean(step_times[ok & epoch_starts])) - step
    return float((step + extra / steps_per_epoch) / np.mean(samples[regular]))


def arm_cost(arm: Arm) -> float:
    return cost_per_sample(*arm.pooled(), arm.steps_per_epoch)


def repeat_costs(arm: Arm) -> list[float]:
    """The cost of each repeat on its own (their spread is the run-to-run noise)."""
    return [cost_per_sample(t, s, arm.starts(i), arm.steps_per_epoch)
            for i, (t, s) in enumerate(zip(arm.step_times, arm.samples))]


def run_to_run_noise(arm: Arm) -> float:
    """Typical relative difference between two repeats of the arm: the median over pairs of
    max/min - 1 (0 with fewer than 2 repeats; with 2, their ratio - 1). How much this
    machine drifts; verdicts use the ratio's own spread instead (`paired_noise`).

    Repeats of the *same* config differ only by machine noise (other processes, clocks,
    memory layout), so this is how big a difference noise alone produces on this machine.
    The median over pairs, not the largest pair: the baseline runs in every round and again in
    the verification, minutes apart, and the range of n repeats only grows with n (four
    baseline repeats spread 1.35-1.68 ms/sample over one 8-minute tune made a 1.21x win with
    a 95 % interval of 1.18-1.22 read as noise).
    """
    costs = [c for c in repeat_costs(arm) if math.isfinite(c) and c > 0]
    if len(costs) < 2:
        return 0.0
    spreads = [max(a, b) / min(a, b) - 1.0 for i, a in enumerate(costs) for b in costs[i + 1:]]
    return float(np.median(spreads))


def paired_noise(reference: Arm, candidate: Arm) -> float:
    """How much the rounds' speedups disagree: twice the median relative deviation of
    q_r = cost(reference_r) / cost(candidate_r) from their median (0 with one round).

    Repeat r of both arms ran in round r, minutes from the other rounds, side by side with each
    other. A machine that drifts between rounds moves both arms alike, and interleaving cancels
    that, so the spread of one arm's repeats overstates the noise of the *ratio*. On a 2-core VM
    whose repeats drifted 26-59 % between rounds, a loader worker + 1 compute thread read
    1.18-1.41x in every round: 2-8 % paired noise, yet "no measurable change" against the arms'
    spread. The ratio's own spread still catches drift *within* a round: a round where the
    baseline ran slow and its candidate fast reads as a different q, and the noise grows.
    """
    qs = [math.exp(x) for x in round_log_ratios(reference, candidate)]
    if len(qs) < 2:
        return 0.0
    # Twice the median relative deviation from the rounds' median q: with two rounds, their
    # difference over their mean; with three or more, one odd round cannot set it. The median
    # over *pairs* could: two of three pairs hold the odd round (a slow baseline trial made
    # q = 1.19, 1.76, 1.23 read as 43 % noise and refused a 1.37x verification).
    mid = float(np.median(qs))
    return 2.0 * float(np.median([abs(q / mid - 1.0) for q in qs]))


def round_log_ratios(reference: Arm, candidate: Arm) -> list[float]:
    """log q_r per round, q_r = cost(reference_r) / cost(candidate_r) (finite rounds only)."""
    return [math.log(r / c) for r, c in zip(repeat_costs(reference), repeat_costs(candidate))
            if math.isfinite(r) and math.isfinite(c) and r > 0 and c > 0]


# Residuals needed before a pooled spread is trusted (three comparisons of two rounds).
MIN_POOLED = 6
# A comparison's speedup must clear this many standard errors of its mean over rounds.
POOLED_Z = 2.0


def pooled_round_sd(comparisons: Sequence[Sequence[float]]) -> float:
    """The machine's noise on one round's log speedup, pooled over a tune's comparisons: a
    robust standard deviation (median absolute residual / 0.6745) of each round's log q around
    its own comparison's mean, residuals scaled by sqrt(n / (n - 1)) so two rounds count as
    much as ten. 0 until MIN_POOLED residuals exist.

    Two rounds of one comparison give one spread, itself a noisy estimate: on a 2-core VM
    whose trials of one config differed by 15 % back to back, a step read q = 1.65 and 1.63
    (1 % spread) and was crowned 1.64x; the same config then read 1.3x against itself as the
    next step's reference. Every comparison of a tune runs on the same machine, so their
    residuals together measure its noise with many degrees of freedom (15.5 % per round
    there, from 22 residuals)."""
    residuals: list[float] = []
    for logs in comparisons:
        n = len(logs)
        if n < 2:
            continue
        mean = sum(logs) / n
        scale = math.sqrt(n / (n - 1))
        residuals += [abs(x - mean) * scale for x in logs]
    if len(residuals) < MIN_POOLED:
        return 0.0
    return float(np.median(residuals)) / 0.6745


def pooled_noise(round_sd: float, rounds: int) -> float:
    """The relative speedup that noise of `round_sd` per round reaches over `rounds` rounds
    (POOLED_Z standard errors of their mean log q)."""
    if round_sd <= 0 or rounds < 1:
        return 0.0
    return math.exp(POOLED_Z * round_sd / math.sqrt(rounds)) - 1.0


@dataclass(frozen=True, slots=True)
class Comparison:
    """Candidate vs reference: speedup = reference cost / candidate cost (> 1 is faster)."""

    speedup: float
    ci_low: float
    ci_high: float
    noise: float
    """The relative change below which a difference is called noise (>= min_effect)."""
    reference_cost: float
    candidate_cost: float
    noise_from: str = ""
    """Which estimate set `noise`: NOISE_FLOOR, NOISE_ROUNDS or NOISE_POOLED."""

    def as_dict(self) -> dict[str, float]:
        return {"speedup": self.speedup, "ci_low": self.ci_low, "ci_high": self.ci_high,
                "noise": self.noise, "reference_cost_s": self.reference_cost,
                "candidate_cost_s": self.candidate_cost}


# Bootstrap replicates drawn at once, at most this many step slots (replicates x steps) per block.
_BOOT_BLOCK = 1 << 21


def _bootstrap_costs(arm: Arm, rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` bootstrap replicates of the arm's cost, resampling steps within each repeat
    (so an arm with one slow repeat keeps that structure instead of smearing it), and epoch
    starts only among epoch starts (each replicate keeps as many as the trial had).

    Every replicate is one row of an index matrix, costed by whole-array numpy (a sort per row
    for the trimmed mean): a tune compares its arms hundreds of times while it spends its
    budget, and replicate by replicate those comparisons took 57 of a simulated tune's 60 s."""
    strata: list[tuple[np.ndarray, np.ndarray, bool]] = []  # (times, samples, epoch-start group)
    for i, (t, s) in enumerate(zip(arm.step_times, arm.samples)):
        starts = arm.starts(i)
        groups = [(np.flatnonzero(~starts), False), (np.flatnonzero(starts), True)] if starts is not None \
            else [(np.arange(len(t)), False)]
        strata += [(t[m], s[m], g) for m, g in groups if len(m)]
    if not strata:
        return np.full(n, math.nan)
    width = sum(len(t) for t, _, _ in strata)
    out = np.empty(n)
    block = max(1, _BOOT_BLOCK // max(1, width))
    for lo in range(0, n, block):
        rows = min(block, n - lo)
        picks = [rng.integers(0, len(t), (rows, len(t))) for t, _, _ in strata]
        times = np.concatenate([t[p] for (t, _, _), p in zip(strata, picks)], axis=1)
        samples = np.concatenate([s[p] for (_, s, _), p in zip(strata, picks)], axis=1)
        marks = np.concatenate([np.full(len(t), g) for t, _, g in strata])
        out[lo:lo + rows] = _replicate_costs(times, samples, marks, arm.steps_per_epoch)
    return out


def _replicate_costs(times: np.ndarray, samples: np.ndarray, marks: np.ndarray,
                     steps_per_epoch: float | None) -> np.ndarray:
    """cost_per_sample of every row of `times`/`samples` (columns marked by `marks` are epoch
    starts). Rows holding a step cost_per_sample would leave out (not finite, no samples) go
    through it one by one; a trial's steps are all finite in practice."""
    bad = ~(np.isfinite(times) & np.isfinite(samples) & (samples > 0)).all(axis=1)
    amortize = bool(steps_per_epoch) and bool(marks.any())
    regular = ~marks if amortize else np.ones(len(marks), bool)
    if not regular.any():  # every step an epoch's first
        costs = np.full(len(times), math.nan)
    else:
        step = _trimmed_rows(times[:, regular])
        if amortize:  # the epoch starts' extra time, once per epoch
            step = step + (np.mean(times[:, marks], axis=1) - step) / steps_per_epoch
        costs = step / np.mean(samples[:, regular], axis=1)
    for r in np.flatnonzero(bad):
        costs[r] = cost_per_sample(times[r], samples[r], marks, steps_per_epoch)
    return costs


def _trimmed_rows(times: np.ndarray) -> np.ndarray:
    """trimmed_step_time of every row."""
    width = times.shape[1]
    drop = max(1, round(width * SLOW_TRIM)) if width > 1 else 0
    return np.mean(np.sort(times, axis=1)[:, :width - drop], axis=1)


def bracket_spread(brackets: Sequence[Sequence[float]]) -> float:
    """How much the reference trials around a candidate's disagree: per round with two or more,
    their max/min - 1; the median over those rounds (0 with none).

    They ran the same config, one just before the candidate's trial and one just after: what
    they differ by, the machine did to the candidate too. One round cannot measure its own
    noise otherwise: karpathy/makemore beside a neighbour that left mid-round read
    foreach 1.87x (its brackets' baselines 2.94 and 0.63 ms/sample) and compile 1.52x (0.63
    and 0.96, nothing else running), both "faster" at a 3 % noise floor."""
    spreads = [max(costs) / min(costs) - 1.0 for costs in
               ([c for c in bracket if math.isfinite(c) and c > 0] for bracket in brackets) if len(costs) >= 2]
    return float(np.median(spreads)) if spreads else 0.0


def compare(reference: Arm, candidate: Arm, *, min_effect: float = 0.03, n_boot: int = 400,
            level: float = 0.95, seed: int = 0, round_sd: float = 0.0, bracket: float = 0.0) -> Comparison:
    """Speedup of `candidate` over `reference` with a bootstrap confidence interval.

    The noise threshold is the largest of `min_effect`, the spread of the speedup between
    this comparison's rounds (`paired_noise`: repeat r of each arm ran interleaved in round r)
    and what the machine's per-round noise `round_sd` (`pooled_round_sd`) reaches over that
    many rounds: a speedup smaller than what the rounds disagree by is not a result. And
    `bracket`, what the reference trials around the candidate's disagree by (bracket_spread).
    """
    ref_cost, cand_cost = arm_cost(reference), arm_cost(candidate)
    speedup = ref_cost / cand_cost if cand_cost > 0 else math.nan
    rng = np.random.default_rng(seed)
    ratios = _bootstrap_costs(reference, rng, n_boot) / _bootstrap_costs(candidate, rng, n_boot)
    ratios = ratios[np.isfinite(ratios)]
    alpha = (1.0 - level) / 2
    lo, hi = ((float(np.quantile(ratios, alpha)), float(np.quantile(ratios, 1 - alpha)))
              if ratios.size else (math.nan, math.nan))
    rounds = min(reference.repeats, candidate.repeats)
    # The brackets' spread is one round's noise (a single round's only measure of it); the mean
    # of n rounds carries 1/sqrt(n) of it (averaging_rounds). Undivided, it was a bar no number of
    # rounds could clear: timm's bf16 read faster in each of 6 verification rounds, 1.25x (CI
    # 1.10-1.38), against brackets 14 % apart, and was refused as "no measurable change". The
    # rounds' own spread (paired_noise) stays whole: it is what keeps a null setting given extra
    # rounds from being crowned by their luck.
    noise, source = max((min_effect, NOISE_FLOOR), (paired_noise(reference, candidate), NOISE_ROUNDS),
                        (pooled_noise(round_sd, rounds), NOISE_POOLED),
                        (bracket * averaging_rounds(rounds), NOISE_BRACKET), key=lambda item: item[0])
    return Comparison(speedup=speedup, ci_low=lo, ci_high=hi, noise=noise,
                      reference_cost=ref_cost, candidate_cost=cand_cost, noise_from=source)


NOISE_FLOOR = "the tune's --min-effect floor"
NOISE_ROUNDS = "this setting's rounds disagree by that much"
NOISE_POOLED = "the machine's noise per round, pooled over the tune"
NOISE_BRACKET = "the reference trials run around it disagree by that much"


SPREAD_Z = 1.5
"""One round's spread (twice its median deviation, ~1.35 sd) times this over sqrt(n) is ~2
standard errors of the mean of n rounds, POOLED_Z's bar."""


def averaging_rounds(rounds: int) -> float:
    """What a spread measured round by round is worth against the mean of `rounds` rounds:
    1 up to two rounds (an ablation's two rounds are judged as before), then SPREAD_Z/sqrt(n)
    (0.87 at three rounds, 0.61 at six)."""
    return min(1.0, SPREAD_Z / math.sqrt(max(1, rounds)))


def noise_band(noise: float) -> tuple[float, float]:
    """The speedups noise of `noise` reaches: 1/(1 + noise) .. 1 + noise."""
    return 1.0 / (1.0 + noise), 1.0 + noise


def speed_verdict(c: Comparison) -> str:
    """faster when the whole interval lies above the noise band, slower when wholly below it,
    else no measurable change: a verdict read off the table's CI and noise columns alone (the
    speedup clearing the band with an interval reaching into it, 2.10x at 1.37-3.28 against a
    wider band, was no answer the table could explain)."""
    if not (math.isfinite(c.speedup) and math.isfinite(c.ci_low) and math.isfinite(c.ci_high)):
        return NO_CHANGE
    low, high = noise_band(c.noise)
    if c.ci_low > high:
        return FASTER
    if c.ci_high < low:
        return SLOWER
    return NO_CHANGE


def split_rounds(verdict: str, reference: Arm, candidate: Arm) -> str | None:
    """Why a faster/slower verdict does not stand, or None: with three rounds or more, the middle
    round's speedup points the other way (or nowhere). The verdict reads the pooled costs, and one
    trial that a neighbour's load slowed tenfold outweighs every other: word_language_model's
    log interval read 1.3-1.9x, 1.1-1.3x and 0.09-0.14x over three rounds, and was called
    "slower", 0.34x (CI 0.30-0.45); its fused AdamW likewise read 0.12x "slower" in one tune and
    1.34x faster in the next."""
    logs = round_log_ratios(reference, candidate)
    if verdict not in (FASTER, SLOWER) or len(logs) < 3:
        return None
    middle = math.exp(float(np.median(logs)))
    if (middle > 1.0) == (verdict == FASTER) and middle != 1.0:
        return None
    qs = sorted(math.exp(x) for x in logs)
    return (f"not {verdict}: its {len(qs)} rounds read {qs[0]:.2f}-{qs[-1]:.2f}x, the middle one {middle:.2f}x; "
            "the pooled figure rests on one round's trials")


def loss_delta(reference: float | None, candidate: float | None) -> float | None:
    """Relative loss change (candidate - reference) / |reference|; inf for a non-finite
    candidate loss (NaN/overflow); None when either side has no loss."""
    if reference is None or candidate is None or not math.isfinite(reference):
        return None
    if not math.isfinite(candidate):
        return math.inf
    return (candidate - reference) / max(abs(reference), 1e-12)


def loss_ok(delta: float | None, tolerance: float) -> bool:
    """A candidate keeps loss parity unless its loss is worse by more than `tolerance` (or
    not finite). A *lower* loss is not a mismatch: a larger batch sees more data per step."""
    return delta is None or delta <= tolerance


def verdict(c: Comparison | None, delta: float | None, *, tolerance: float,
            failed: bool = False) -> str:
    """The one word a knob setting gets in the table; loss parity overrides any speedup."""
    if failed or c is None:
        return FAILED
    if not loss_ok(delta, tolerance):
        return LOSS_MISMATCH
    return speed_verdict(c)
