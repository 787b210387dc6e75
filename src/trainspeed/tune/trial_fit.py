"""A script trial's length, sized to the budget from what the first baseline trial really took.

The first baseline trial is a doctor run of the unchanged script; its wall time splits into a
fixed part (start-up: interpreter or fork, the script's imports, building its model and data),
its warm-up steps and its measured steps. A trial of W warm-up and N measured steps then costs
fixed + warm-up + N x step. The tune's plan holds T such trials (ablation, brackets,
verification): N is the most steps (up to the length that quality asks for) with which T
trials fit the budget left, never fewer than MIN_FIT_STEPS; where that is not enough the warm-up
is cut to MIN_FIT_WARMUP steps (each trial's own slow first steps are still left out: settle.py).

Real scripts with steps of 0.5-10 s ran 25 measured steps a trial (MIN_MEASURED_STEPS): an image
classifier's 64 s trials left a 5-minute tune only its baseline.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Protocol, Sequence

from trainspeed.tune.settle import MIN_SETTLE_STEPS


class FirstTrial(Protocol):
    """What the sizing reads of the first baseline trial (a tune.trials.TrialResult). A protocol,
    not that class: the doctor's checks import this module (budget_to_measure), and trials.py
    reaches them back through short_run.py and script_flags.py."""

    step_times: list[float]
    wall_s: float
    warmup_s: float | None

MIN_FIT_STEPS = 6
"""Fewest measured steps a trial is cut to for the budget (the slowest 5 % trimmed leaves 5)..."""
MIN_FIT_S = 3.0
SLOW_MIN_FIT_STEPS = 3
"""... or, for steps so slow that MIN_FIT_STEPS of them take over MIN_FIT_S, as many as take
MIN_FIT_S, at least this many: nanoGPT's 8 s steps on a loaded 2-core machine."""
MIN_FIT_WARMUP = 1
"""Warm-up steps a cut trial keeps: the first step pays the one-time costs, and a setting's
slower first measured steps are warm-up too (settle.py)."""
PRICING_SHARE = 0.08
"""The first baseline trial stops once it is this share of the budget old (after its warm-up and
3 steps), within PRICING_S: it only has to find the step time."""
PRICING_S = (10.0, 60.0)
PRICING_WARMUP = 2
"""Warm-up steps of that first trial (its slow first measured steps are warm-up too:
settle.py): nanoGPT's 8 s steps made a 5-step warm-up 40 s of a 6m budget."""


def pricing_seconds(budget_s: float) -> float:
    """How old the first (pricing) baseline trial may grow before it stops."""
    return min(PRICING_S[1], max(PRICING_S[0], PRICING_SHARE * budget_s))


def budget_to_measure(step_s: float, start_s: float, cost_factors: Sequence[float], *, first_step_s: float = 0.0,
                      repeats: int = 2, every: int = 2, verify: int = 3) -> float:
    """Seconds a script tune needs to measure settings whose trials cost `cost_factors` baseline
    trials each, at the shortest trials (1 warm-up step of `first_step_s`, the one-time costs,
    at least a step, + min_fit_steps measured steps of `step_s`, `start_s` to start), and to
    verify a winner: its first trial (PRICING_WARMUP + 3 steps), then what BudgetPlan admits
    against: every round's baseline brackets, the settings' repeats and the verification's
    rounds. The doctor's tune commands ask for this (with a margin)
    where the default budget cannot pay for it: time_sequence_prediction's 35 s LBFGS steps
    left a 10-minute compile tune nothing to measure."""
    from trainspeed.tune.order import n_brackets

    warm = max(first_step_s, step_s) + (MIN_FIT_WARMUP - 1) * step_s
    trial = start_s + warm + min_fit_steps(step_s) * step_s
    first = start_s + warm + (PRICING_WARMUP - MIN_FIT_WARMUP + MIN_SETTLE_STEPS) * step_s
    units = repeats * (sum(cost_factors) + n_brackets(len(cost_factors), every)) + 2 * verify
    return first + units * trial


GROWN_STEPS = 1.5
"""First-trial steps whose last third's median is 1.5x the first third's grow with the step's
index: pytorch/examples' reinforce.py trains an episode a step, and its episodes lengthen as the
policy learns (a first trial of 25 steps of 12-46 ms priced 212-step trials at ~6 s; they took
25-58 s, and bf16 was stopped "far slower" at 30 s against that price). Such steps are priced
along a line through them (each step adding the same time to the next), not at their median."""
GROWTH_MIN_STEPS = 9


def step_growth(steps: Sequence[float]) -> tuple[float, float] | None:
    """(first step's time, seconds each step adds to the next) of a line through the measured
    step times (Theil-Sen: the median of pairwise slopes, at most 60 steps, evenly taken) when
    they grew by GROWN_STEPS, else None."""
    n = len(steps)
    if n < GROWTH_MIN_STEPS:
        return None
    third = n // 3
    early, late = statistics.median(steps[:third]), statistics.median(steps[-third:])
    if not early > 0 or late / early < GROWN_STEPS:
        return None
    picked = sorted({round(i * (n - 1) / 59) for i in range(60)}) if n > 60 else list(range(n))
    slopes = [(steps[j] - steps[i]) / (j - i) for a, i in enumerate(picked) for j in picked[a + 1:]]
    slope = statistics.median(slopes)
    if not slope > 0:
        return None
    start = statistics.median(t - slope * k for k, t in enumerate(steps))
    return max(start, min(steps)), slope


def _steps_cost(n: int, step_s: float, growth: tuple[float, float] | None) -> float:
    """Seconds of n measured steps: n x the median step, or along the line of grown steps."""
    if growth is None:
        return n * step_s
    start, slope = growth
    return n * start + slope * n * (n - 1) / 2


def _steps_within(seconds: float, step_s: float, growth: tuple[float, float] | None) -> int:
    """The most measured steps whose cost (_steps_cost) fits `seconds`."""
    if growth is None:
        return int(math.floor(seconds / step_s))
    if seconds <= 0:
        return int(math.floor(seconds / max(step_s, 1e-9)))
    start, slope = growth
    # slope/2 n^2 + (start - slope/2) n - seconds = 0
    b = start - slope / 2
    return int(math.floor((-b + math.sqrt(b * b + 2 * slope * seconds)) / slope))


@dataclass(frozen=True, slots=True)
class TrialFit:
    warmup_steps: int
    measure_steps: int
    price_s: float
    """Expected wall seconds of one trial of this length."""
    fixed_s: float
    """The first trial's start-up: its wall time less its steps."""
    step_s: float
    """Median measured step time of the first trial."""
    cut: bool
    """True when the budget made the trials shorter than `max_steps`."""
    fits: float = math.inf
    """Trials of this length the budget left pays for (fewer than planned where even the
    fewest steps do not fit them all)."""
    growth_s: float = 0.0
    """Seconds each measured step added to the next in the first trial (step_growth), 0 when
    its steps did not grow: the price follows that line."""


def fit_trial(base: FirstTrial, warmup_steps: int, trials: float, budget_left: float, max_steps: int,
              first_warmup: int | None = None, stored: tuple[int, int] | None = None) -> TrialFit:
    """The trial length for T=`trials` trials in `budget_left` seconds (see the module docstring).
    `warmup_steps` is what later trials run unless cut; `first_warmup` what the first trial ran
    (default the same). `stored`: the (warm-up, measured) steps of the trials an earlier tune
    into this --out ran, kept wherever they are no longer than this budget's, so a tune resumed
    with a larger --budget reuses them and spends the rest on more rounds (sized afresh, every
    stored trial was run again)."""
    first_warmup = warmup_steps if first_warmup is None else first_warmup
    steps = [t for t in base.step_times if t > 0]
    step_s = statistics.median(steps) if steps else 0.0
    growth = step_growth(steps)
    warm_s = base.warmup_s or 0.0
    fixed = max(0.0, base.wall_s - sum(steps) - warm_s)

    def warm_cost(w: int) -> float:  # the first warm-up steps pay the one-time costs: keep them
        return max(0.0, warm_s + (w - first_warmup) * step_s)

    def steps_for(w: int) -> int:
        if step_s <= 0:
            return max_steps
        per_trial = budget_left / max(trials, 1.0)
        return _steps_within(per_trial - fixed - warm_cost(w), step_s, growth)

    w, n = warmup_steps, steps_for(warmup_steps)
    if n < max_steps and warmup_steps > MIN_FIT_WARMUP:
        w, n = MIN_FIT_WARMUP, steps_for(MIN_FIT_WARMUP)
    n = max(min_fit_steps(step_s), min(max_steps, n))
    if w < warmup_steps and n >= max_steps:
        w = warmup_steps
    if stored is not None and stored[0] <= w and stored[1] <= n:
        w, n = stored
    price = fixed + warm_cost(w) + _steps_cost(n, step_s, growth)
    return TrialFit(warmup_steps=w, measure_steps=n, price_s=price, fixed_s=fixed, step_s=step_s, cut=n < max_steps,
                    fits=budget_left / price if price > 0 else math.inf, growth_s=growth[1] if growth else 0.0)


def min_fit_steps(step_s: float) -> int:
    """The fewest measured steps a trial of `step_s` steps is cut to."""
    if step_s <= 0:
        return MIN_FIT_STEPS
    return max(SLOW_MIN_FIT_STEPS, min(MIN_FIT_STEPS, math.ceil(MIN_FIT_S / step_s)))


def trial_length_line(base: FirstTrial, fit: TrialFit, trials: float,
                      length_from: str = "--steps sets the measured steps") -> str:
    """What the first trial took and how long every trial will be, in the user's terms;
    `length_from` says where the measured steps' number came from."""
    steps = [t for t in base.step_times if t > 0]
    spread = (f"{len(steps)} steps of {_s(min(steps))}-{_s(max(steps))} (median {_s(fit.step_s)})"
              if steps else "no measured steps")
    if fit.growth_s > 0:
        spread += f", each ~{_s(fit.growth_s)} longer than the one before: trials are priced as their steps grow"
    line = (f"the first baseline trial took {base.wall_s:.0f} s: {fit.fixed_s:.1f} s to start, {spread}; "
            f"each trial runs {fit.warmup_steps} warm-up + {fit.measure_steps} measured steps (~{fit.price_s:.0f} s)")
    if fit.cut and fit.fits < trials:
        line += (f", the fewest for steps this long: the budget left pays for ~{fit.fits:.0f} such trials, not the "
                 f"~{trials:.0f} planned")
    elif fit.cut:
        line += f", cut to fit ~{trials:.0f} trials in the budget"
    return line + f" ({length_from})"


def _s(seconds: float) -> str:
    return f"{1e3 * seconds:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


__all__ = ["GROWN_STEPS", "MIN_FIT_STEPS", "MIN_FIT_WARMUP", "PRICING_WARMUP", "TrialFit", "budget_to_measure", "fit_trial",
           "min_fit_steps", "pricing_seconds", "step_growth", "trial_length_line"]
