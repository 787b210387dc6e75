"""A phase's share of the step: what a machine-wide slowdown cannot move. Pure numpy.

Other processes' load, and the machine's own speed drifting over seconds, slow every phase of
a step alike; the script's own growth lands in the phase that does the growing work (a history
re-read at each log line). So shares of the step tell the two apart where wall and CPU times
cannot (telemetry/contention.py reads the load; this reads the shares).

  grown_share         the phase whose share grew, read from its low quantile (the steps that
                      did not wait for a core)
  share_growth_ratio  the step's growth a phase's share implies, whatever the machine did
  machine_drift       a rise every phase shares, within what the machine's speed drifts
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["DRIFT_RATIO", "DRIFT_SHARE", "MIN_STEPS", "PHASE_RISE_MIN", "SATURATED_SHARE_GROWTH", "SHARE_GROWTH",
           "finite_median", "grown_share", "machine_drift", "phase_share_moves", "phase_shares", "share_grew",
           "share_growth_ratio"]

MIN_STEPS = 5
"""Steps each side of a comparison needs (a quarter of the steps, loaded or quiet steps)."""


def finite_median(values: np.ndarray) -> float:
    """The median of the finite values; NaN when there are none."""
    values = values[np.isfinite(values)]
    return float(np.median(values)) if values.size else math.nan


SHARE_GROWTH = 0.05
"""A phase whose share of the step rose by 5 points from the first to the last quarter of the
steps grew by itself: other processes' load slows every phase alike."""
PHASE_RISE_MIN = 0.2
"""...and its own undisturbed time rose by a fifth of the step's at least, the least growth the
doctor reports (doctor.checks.loop.GROWTH_MIN_RATIO): on a machine whose cores others kept full,
this process's CPU time per step rose 30 % and not in every phase alike (manual_sgd_ckpt: the
loop's own code between the phases +0.5 ms of a 5 ms step, 5.7 points of share)."""
SATURATED_SHARE_GROWTH = 0.25
"""Beside others that keep every core full, a phase's share must grow by 25 points: there one
scheduler slice (4 ms at HZ=250) in most steps moves a short phase's low quantile too (healthy,
unchanged: the optimizer's 2.4 -> 6.3 ms, 16 points of share, while its CPU time per step rose
8.9 -> 11.6 ms at the same reading of the others), while the growths this has to find grew by
28-40 points (growing_log 0.6 -> 0.9 of the step in each of its runs; the logging cost of
test_contention_stories 0.04 -> 0.42)."""
SHARE_QUANTILE = 10.0
"""A phase's time over a stretch of steps is read as its 10th percentile there (over the steps
that ran it, times the share of steps that did), not its median: a descheduled process resumes
a scheduler slice later (4 ms at HZ=250) in whichever phase it was in, so on a busy machine a
phase's median follows where the waits landed. manual_sgd_ckpt, unchanged, on a 2-core VM whose
cores others kept full: backward's median share of the step went 12 -> 29 %, checkpointing's
34 -> 12 %, and the loop's own code between the phases waited in 3 of 4 late steps (its 25th
percentile 1.5 -> 4.9 ms), while their 10th percentiles, the steps that did not wait, kept
their shares (1.3 -> 1.8 ms)."""


def _phase_cost(values: np.ndarray) -> float:
    """A phase's undisturbed time per step over some steps (SHARE_QUANTILE); NaN unmeasured."""
    v = values[np.isfinite(values)]
    if v.size < MIN_STEPS:
        return math.nan
    ran = v[v > 0]
    return float(np.percentile(ran, SHARE_QUANTILE)) * ran.size / v.size if ran.size else 0.0


def _quarter(wall: np.ndarray) -> int | None:
    """Steps in a quarter of `wall` (MIN_STEPS at least), or None when there are too few for a
    first and a last quarter."""
    q = max(MIN_STEPS, wall.size // 4)
    return q if wall.size >= 2 * q else None


def _quarter_costs(size: int, q: int, phases: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """Each phase's undisturbed time per step (_phase_cost) in the first and last `q` steps, for
    the phases measured over all `size` steps and in both quarters."""
    costs = {name: (_phase_cost(v[:q]), _phase_cost(v[-q:])) for name, values in phases.items()
             if (v := np.asarray(values, dtype=np.float64).ravel()).size == size}
    return {k: c for k, c in costs.items() if math.isfinite(c[0]) and math.isfinite(c[1])}


def grown_share(wall: np.ndarray, phases: dict[str, np.ndarray], cpu: np.ndarray | None = None, *,
                min_share: float = SHARE_GROWTH) -> str | None:
    """The phase whose share of the step grew most (by `min_share` at least, its own time by
    PHASE_RISE_MIN of the step's) from the first quarter of the steps to the last, shares of
    the phases' undisturbed times (_phase_cost); None when none grew. A load, the machine's or
    a slower CPU's, scales every phase alike. With `cpu` (this process's CPU time per step),
    only while that rose by PHASE_RISE_MIN too: a phase of 60 ms waits for a core in every
    step at a quarter of one, so even its low quantile moves with the waits (word_language_model
    beside others' full cores: forward's rose 60 -> 102 ms, 5 points of share, while the CPU
    time per step went 68 -> 71 ms); the script's own growth is work: growing_log's CPU time
    per step rose 3.3-5x."""
    w = np.asarray(wall, dtype=np.float64).ravel()
    q = _quarter(w)
    if q is None:
        return None
    if cpu is not None:
        c = np.asarray(cpu, dtype=np.float64).ravel()
        early_cpu, late_cpu = finite_median(c[:q]), finite_median(c[-q:])
        if c.size != w.size or not late_cpu >= (1.0 + PHASE_RISE_MIN) * early_cpu:
            return None
    costs = _quarter_costs(w.size, q, phases)
    early, late = sum(c[0] for c in costs.values()), sum(c[1] for c in costs.values())
    if not (early > 0 and late > 0):
        return None
    rise = {k: c[1] / late - c[0] / early for k, c in costs.items()}
    best = max(rise, key=rise.__getitem__, default=None)
    if best is None or rise[best] < min_share:
        return None
    return best if costs[best][1] - costs[best][0] >= PHASE_RISE_MIN * early else None


def share_grew(wall: np.ndarray, phases: dict[str, np.ndarray], cpu: np.ndarray | None = None) -> bool:
    """Did some phase's share of the step grow (SHARE_GROWTH) from the first quarter of the
    steps to the last? Shares are what a changing load cannot move much (grown_share)."""
    return grown_share(wall, phases, cpu) is not None


DRIFT_RATIO = 1.5
"""A step that slowed by less than this from the first quarter of the judged steps to the last,
every phase alike, is within what the machine's own speed drifts. A fixed step (one thread, CPU
time equal to wall time throughout, no other process's load to read) on an idle 2-core VM,
read in 188 windows of 160 steps: last vs first quarter x1.06 median, x1.22 at the 95th
percentile, x1.40 at most (benchmarks/machine_drift.py). On CI the doctor had called x1.21 and
x1.28 'step time grows' on runs of an unchanged script."""
DRIFT_SHARE = SHARE_GROWTH
"""...every phase alike: no phase's share of the step (its undisturbed time, _phase_cost) moved
by 5 points. In those windows the shares of forward, backward and optimizer moved 0.4 points
(median), 2.0 at most, also in the 14 windows that slowed x1.2 or more; the script's own growth
lands in the phase that does the growing work (a history re-read at each log line: its share
0.04 -> 0.42 of the step)."""


def phase_shares(wall: np.ndarray, phases: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """Each measured phase's (share of the step in the first quarter of the steps, in the last),
    shares of the phases' undisturbed times (_phase_cost); {} when too few steps or nothing
    measured."""
    w = np.asarray(wall, dtype=np.float64).ravel()
    q = _quarter(w)
    if q is None:
        return {}
    costs = _quarter_costs(w.size, q, phases)
    early, late = sum(c[0] for c in costs.values()), sum(c[1] for c in costs.values())
    if not (early > 0 and late > 0):
        return {}
    return {k: (c[0] / early, c[1] / late) for k, c in costs.items()}


def phase_share_moves(wall: np.ndarray, phases: dict[str, np.ndarray]) -> dict[str, float]:
    """Each measured phase's share of the step in the last quarter of the steps less its share
    in the first (phase_shares)."""
    return {k: late - early for k, (early, late) in phase_shares(wall, phases).items()}


def share_growth_ratio(wall: np.ndarray, phases: dict[str, np.ndarray]) -> tuple[str, float] | None:
    """(the phase whose share of the step grew most, the step's growth that share implies), or
    None when no share grew. A phase going from share s0 to s1 while the rest of the step kept
    its time makes the step (1 - s0) / (1 - s1) times longer, whatever the machine's speed did
    meanwhile (it scales every phase alike): the growth read through the machine's drift (a
    history re-read at each log line, +5.5 ms on 17 ms steps, read x1.19 on wall times that
    started in a slow stretch of the VM)."""
    shares = phase_shares(wall, phases)
    if not shares:
        return None
    name = max(shares, key=lambda k: shares[k][1] - shares[k][0])
    early, late = shares[name]
    if not (late - early > 1e-6 and late < 1.0):
        return None
    return name, (1.0 - early) / (1.0 - late)


def machine_drift(wall: np.ndarray, phases: dict[str, np.ndarray]) -> bool:
    """Is the step's rise between the first and last quarter of the steps one the machine's own
    speed makes: below DRIFT_RATIO, with every phase slowed alike (no share moved DRIFT_SHARE)?
    A single phase (nothing else measured) cannot show which: judged on the ratio alone."""
    w = np.asarray(wall, dtype=np.float64).ravel()
    q = _quarter(w)
    if q is None:
        return False
    early, late = finite_median(w[:q]), finite_median(w[-q:])
    if not (early > 0 and late / early < DRIFT_RATIO):
        return False
    moves = phase_share_moves(w, phases)
    return all(abs(m) < DRIFT_SHARE for m in moves.values())
