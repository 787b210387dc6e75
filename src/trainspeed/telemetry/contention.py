"""A busy machine or a slower script? Pure numpy, numbers in and numbers out.

On a shared machine other processes start and stop; each time they take cores, every step of
the training script gets slower in wall time, in every phase alike, while the CPU time the
script itself spends per step stays where it was. A script that really gets slower (a growing
history re-read every step, a checkpoint that grows) spends more CPU time, or a bigger share of
its step in one phase, whatever the machine does.

  detect_contention   steps whose wall time rose while this process's CPU time per step did
                      not, and other processes used the cores (from the system sampler)
  robust_step_times   step and phase times with the machine's load taken out: the CPU time
                      per step (scaled to wall seconds by the run's usual wall/CPU ratio), each
                      phase its share of it; what the trend of the script is judged on
  load_per_step       the sampler's other-process CPU lined up with the steps
  level_with_start    steps whose load (the others' readings, whether this process's threads
                      fit in the cores left free, what this process got) matches the start's:
                      the only steps a trend may compare while the load changes
  saturated           were the cores all in use, shared with others? Then no reading shows their
                      load change, and CPU time per step moves with what they run
  (grown_share and the other readings of a phase's share of the step: phase_shares.py)
  linear_rate         a robust slope per 1,000 steps (RSS, a phase) with its noise test
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trainspeed.telemetry.phase_shares import MIN_STEPS
from trainspeed.telemetry.phase_shares import finite_median as _median
from trainspeed.telemetry.trend import robust_clip, theil_sen

__all__ = ["Contention", "detect_contention", "level_with_start", "load_per_step", "loaded_mask",
           "robust_step_times", "saturated", "linear_rate", "LOAD_MIN", "SLOWDOWN_MIN", "CPU_SHARE_MAX"]

LOAD_MIN = 40.0
"""Other processes count as a load when they use at least this many % of one core more than in
the quietest tenth of the run (a shared machine is never idle; what matters is the change)."""
SLOWDOWN_MIN = 0.10
"""A wall-time rise under load of less than 10 % is not worth a finding."""
CPU_SHARE_MAX = 0.5
"""The script's own CPU time per step may explain at most half of the wall-time rise for the
rise to be the machine's: more than that and the script itself does more work."""
PARTIAL_LOAD_MIN = LOAD_MIN / 2
"""A smaller rise counts for a step that also waited for the cores (its wall/CPU ratio stands
above the quiet steps'): on a machine whose cores were all busy already, other processes can
only gain what this process loses (two busy loops started on a saturated 2-core VM raised
them from 1.3 to 1.6 cores while the script fell from 0.7 to 0.4 of one), so LOAD_MIN alone
left most loaded steps among the quiet ones, and their wall times read as a growing step."""
# MIN_STEPS (phase_shares.py): loaded and quiet steps each needed to compare them.


def load_per_step(step_end: np.ndarray, sample_t: np.ndarray, others: np.ndarray, *, spread: int = 1) -> np.ndarray:
    """Other processes' CPU (% of one core) during each step: the value of the sampler row whose
    interval (previous row, this row] holds the step's end (`step_end`, wall-clock seconds, as
    `t_wall` of the step records), or the largest within `spread` rows of it: a row covers a
    fraction of a second, and a load that starts inside one row reads there as a partial load,
    so the neighbours keep the edges of a loaded stretch out of the quiet steps. NaN for steps
    after the last row or with no reading."""
    step_end = np.asarray(step_end, dtype=np.float64).ravel()
    t = np.asarray(sample_t, dtype=np.float64).ravel()
    o = np.asarray(others, dtype=np.float64).ravel()
    out = np.full(step_end.size, np.nan)
    ok = np.isfinite(t) & np.isfinite(o)
    t, o = t[ok], o[ok]
    if t.size == 0:
        return out
    order = np.argsort(t)
    t, o = t[order], o[order]
    if spread > 0:
        padded = np.pad(o, spread, mode="edge")
        o = np.max(np.lib.stride_tricks.sliding_window_view(padded, 2 * spread + 1), axis=1)
    idx = np.searchsorted(t, step_end, side="left")
    inside = (idx < t.size) & np.isfinite(step_end)
    out[inside] = o[idx[inside]]
    return out


def loaded_mask(
    others: np.ndarray,
    floor: float | None = None,
    *,
    near: np.ndarray | None = None,
    wall: np.ndarray | None = None,
    cpu: np.ndarray | None = None,
) -> np.ndarray | None:
    """Steps under other processes' load: their sampler row reads at least LOAD_MIN above
    `floor` (default: the quietest reading in `others`). A sampler row averages a fraction of a
    second, so the steps next to a loaded row (`near`: load_per_step with spread=1) may be
    loaded too, and a busy machine shows a smaller rise (PARTIAL_LOAD_MIN): such a step counts
    as loaded when its wall/CPU ratio stands above the quiet steps' (it waited for the cores).
    None with too few sampled steps; steps without a reading are not loaded."""
    o = np.asarray(others, dtype=np.float64).ravel()
    mask = _loaded_mask(o, floor)
    if mask is None or near is None or wall is None or cpu is None:
        return mask
    if floor is None or not math.isfinite(floor):
        floor = float(np.nanmin(o))
    w, c = np.asarray(wall, dtype=np.float64).ravel(), np.asarray(cpu, dtype=np.float64).ravel()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(c > 0, w / c, np.nan)
    quiet = ~mask & np.isfinite(ratio)
    if quiet.sum() < MIN_STEPS:
        return mask
    base = float(np.median(ratio[quiet]))
    edge = ~mask & (np.asarray(near, dtype=np.float64).ravel() >= floor + PARTIAL_LOAD_MIN) & (ratio > base * (1.0 + SLOWDOWN_MIN))
    return mask | edge


LEVEL_BAND = 30.0
"""A step's load matches the start's when its neighbourhood's reading (load_per_step,
spread=1) lies within this many % of one core of the start's median reading."""
START_SHARE = 0.2
"""The start: the first fifth of the sampled steps (at least MIN_STEPS)."""
GOT_BAND = 0.35
"""This process's CPU per wall second (rolling median) matches the start's within +-35 %."""
GOT_STEPS = 20
"""Steps outside GOT_BAND that say the load changed (a few slow steps are noise)."""
FIT_MARGIN = 0.75
"""Compute threads fit in the cores other processes leave free while those take at most this
many cores more than the threads leave (a tenant's half core now and then does not make two
threads on two cores spin; a busy loop's full core does)."""


def level_with_start(
    others: np.ndarray, near: np.ndarray, *, threads: int | None = None, cores: int | None = None,
    got: np.ndarray | None = None,
) -> tuple[np.ndarray, bool] | None:
    """(steps whose load matches the start's, whether the load changed at all).

    The start is the first START_SHARE of the steps. A step matches when its neighbourhood's
    other-process CPU (`near`: load_per_step, spread=1, % of one core) lies within LEVEL_BAND
    of the start's median own reading (`others`); with `threads` and `cores` known, when this
    process's compute threads fit in the cores the others leave free as they did (or did not)
    at the start (threads that do not fit spin for a descheduled sibling: 2 threads on 2
    cores beside one busy loop doubled the CPU time per step); and with `got` (this process's
    CPU seconds per wall second, per step), when its rolling median stays within GOT_BAND of
    the start's. On a machine whose cores were all taken already, more load cannot show in the
    others' readings (they cannot pass the cores), only in what this process gets: two busy
    loops beside teacher_ema, others at 1.9 cores before and after, cut it from ~0.2 core to
    ~0.1 and its CPU time per step rose 50 % (hyperthreads share a core). The load changed
    when some step's own reading left the band or the fit, or GOT_STEPS steps left the got
    band. None with too few readings; steps without a reading do not match."""
    raw = np.asarray(others, dtype=np.float64).ravel()
    o = np.asarray(near, dtype=np.float64).ravel()
    finite = np.isfinite(raw)
    if finite.sum() < 2 * MIN_STEPS or o.size != raw.size:
        return None
    idx = np.flatnonzero(finite)
    head = idx[: max(MIN_STEPS, int(START_SHARE * idx.size))]
    start = float(np.median(raw[head]))

    def matches(values: np.ndarray) -> np.ndarray:
        ok = np.isfinite(values) & (np.abs(values - start) <= LEVEL_BAND)
        if threads and threads > 1 and cores:
            fits = values / 100.0 <= cores - threads + FIT_MARGIN
            ok &= fits == (start / 100.0 <= cores - threads + FIT_MARGIN)
        return ok

    level, changed = matches(o), bool((~matches(raw) & finite).any())
    if got is not None and np.asarray(got).size == raw.size:
        g = _rolling_median(np.asarray(got, dtype=np.float64).ravel(), 9)
        g0 = float(np.nanmedian(g[head])) if np.isfinite(g[head]).any() else math.nan
        if math.isfinite(g0) and g0 > 0:
            steady = np.isfinite(g) & (np.abs(np.log(np.where(g > 0, g, np.nan) / g0)) <= math.log(1 + GOT_BAND))
            level &= steady
            changed |= int((~steady & np.isfinite(g)).sum()) >= GOT_STEPS
    return level, changed


SATURATED_MARGIN = 25.0
"""% of one core: the machine's cores count as all in use when this process and the others
together used at least all of them less this margin."""
SATURATED_OTHERS = 50.0
"""...and the others took at least half a core (a script alone on its cores is not contended)."""


def saturated(others: np.ndarray, own: np.ndarray, cores: int | None) -> bool:
    """Were the machine's cores all in use, shared with other processes, for most of the steps
    (`others` and `own`, this process tree's CPU, per step, % of one core; NaN unsampled)? Then
    no reading shows a change of load: the others cannot pass the cores, and this process's CPU
    time per step moves with what they run (caches, memory bandwidth) though it gets the same
    share of a core. module_transforms (one thread, unchanged): CPU time per step 30 -> 57 ms
    from step 117 while the others read 1.6-1.7 cores and it got 0.35 of one throughout."""
    if not cores:
        return False
    o, c = np.asarray(others, dtype=np.float64).ravel(), np.asarray(own, dtype=np.float64).ravel()
    read = np.isfinite(o) & np.isfinite(c)
    if o.size != c.size or read.sum() < 2 * MIN_STEPS:
        return False
    full = (o + c >= 100.0 * cores - SATURATED_MARGIN) & (o >= SATURATED_OTHERS)
    return bool(full[read].mean() >= 0.5)


def _rolling_median(values: np.ndarray, window: int) -> np.ndarray:
    if values.size < window:
        return values
    padded = np.pad(values, window // 2, mode="edge")
    return np.nanmedian(np.lib.stride_tricks.sliding_window_view(padded, window), axis=1)


@dataclass(kw_only=True, slots=True)
class Contention:
    """Steps slowed down by other processes, not by the script."""

    first_step: int
    """First step under load."""
    last_step: int
    """Last step under load."""
    loaded_steps: int
    """Steps under load (they need not be contiguous: loads come and go)."""
    quiet_steps: int
    wall_quiet: float
    """Median wall seconds per step without the load."""
    wall_loaded: float
    """Median wall seconds per step under the load."""
    cpu_quiet: float
    """Median CPU seconds per step of this process without the load."""
    cpu_loaded: float
    others_quiet: float
    """Median CPU of other processes, % of one core, on the quiet steps (NaN: not sampled)."""
    others_loaded: float
    slowdown: float
    """wall_loaded / wall_quiet - 1."""
    cpu_change: float
    """cpu_loaded / cpu_quiet - 1."""
    lost_share: float
    """Share of the run's wall time the load took: what the loaded steps took beyond the quiet
    median, over the sum of all step times."""
    sampled: bool
    """True when the load was seen by the system sampler; False when it is inferred from wall
    time rising without CPU time (no sampler series)."""
    message: str


def _loaded_mask(others: np.ndarray, floor: float | None = None) -> np.ndarray | None:
    finite = np.isfinite(others)
    if finite.sum() < 2 * MIN_STEPS:
        return None
    if floor is None or not math.isfinite(floor):
        floor = float(np.min(others[finite]))
    return finite & (others >= floor + LOAD_MIN)


def _inferred_mask(wall: np.ndarray, cpu: np.ndarray) -> np.ndarray | None:
    """Without sampler data: steps whose wall/CPU ratio stands far above the run's usual one
    (the CPU did not do more, yet the step took longer: time went to someone else)."""
    ratio = wall / cpu
    finite = np.isfinite(ratio) & (cpu > 0)
    if finite.sum() < 2 * MIN_STEPS:
        return None
    base = float(np.percentile(ratio[finite], 25))
    return finite & (ratio >= base * (1.0 + 2.0 * SLOWDOWN_MIN))


def detect_contention(
    steps: np.ndarray,
    wall: np.ndarray,
    cpu: np.ndarray,
    others: np.ndarray | None = None,
    *,
    floor: float | None = None,
    near: np.ndarray | None = None,
) -> Contention | None:
    """Steps made slower by other processes, or None.

    `steps`, `wall` (t_step), `cpu` (this process's CPU seconds per step) and `others` (other
    processes' CPU during the step, % of one core: load_per_step) are per step record, warm-up
    removed; `floor` is the quietest reading and `near` the readings next to each step's (see
    loaded_mask). The load is taken from `others` when it was sampled, else inferred from steps
    whose wall time outgrew their CPU time (then `sampled` is False). It is contention when the
    loaded steps' median wall time is >= SLOWDOWN_MIN above the quiet steps' and the script's
    own CPU time per step explains at most CPU_SHARE_MAX of that rise.
    """
    x = np.asarray(steps, dtype=np.float64).ravel()
    w = np.asarray(wall, dtype=np.float64).ravel()
    c = np.asarray(cpu, dtype=np.float64).ravel()
    if not (x.size == w.size == c.size) or x.size < 2 * MIN_STEPS:
        return None
    o = np.full(x.size, np.nan) if others is None else np.asarray(others, dtype=np.float64).ravel()
    if o.size != x.size:
        return None
    usable = np.isfinite(w) & np.isfinite(c) & (w > 0)
    sampled = True
    loaded = loaded_mask(np.where(usable, o, np.nan), floor, near=near, wall=w, cpu=c)
    if loaded is None:
        sampled = False
        loaded = _inferred_mask(np.where(usable, w, np.nan), np.where(usable, c, np.nan))
        if loaded is None:
            return None
    loaded &= usable
    quiet = usable & ~loaded
    if sampled:
        quiet &= np.isfinite(o)
    if loaded.sum() < MIN_STEPS or quiet.sum() < MIN_STEPS:
        return None
    wq, wl = _median(w[quiet]), _median(w[loaded])
    cq, cl = _median(c[quiet]), _median(c[loaded])
    if not (wq > 0 and cq > 0):
        return None
    slowdown = wl / wq - 1.0
    if slowdown < SLOWDOWN_MIN:
        return None
    # The rise the script's own CPU time explains, in wall seconds (CPU scaled by the quiet
    # wall/CPU ratio: a data-waiting or multi-threaded step does not have wall == CPU).
    cpu_rise = (cl - cq) * (wq / cq)
    if cpu_rise > CPU_SHARE_MAX * (wl - wq):
        return None
    lost = float(np.nansum(np.maximum(0.0, w[loaded] - wq)))
    total = float(np.nansum(w[usable]))
    idx = np.flatnonzero(loaded)
    first, last = int(round(x[idx[0]])), int(round(x[idx[-1]]))
    oq, ol = _median(o[quiet]), _median(o[loaded])
    others_text = (f" while other processes used {ol / 100:.1f} cores (vs {oq / 100:.1f})"
                   if sampled and math.isfinite(ol) else " (no system samples: inferred from wall time "
                   "rising without CPU time)")
    explained = cpu_rise / (wl - wq) if wl > wq else 0.0
    # "46 of steps 6-199": the loaded steps need not be consecutive ("steps 6-199 (46 steps)" read
    # as a count that contradicts the range)
    n_loaded = int(loaded.sum())
    which = f"steps {first}-{last}" if n_loaded == last - first + 1 else f"{n_loaded} of steps {first}-{last}"
    message = (f"{which} took {slowdown * 100:.0f} % longer "
               f"({wq * 1e3:.1f} -> {wl * 1e3:.1f} ms){others_text}; this process's CPU time per step "
               f"({cq * 1e3:.1f} -> {cl * 1e3:.1f} ms) explains {max(0.0, explained) * 100:.0f} % of that")
    return Contention(
        first_step=first, last_step=last, loaded_steps=int(loaded.sum()), quiet_steps=int(quiet.sum()),
        wall_quiet=wq, wall_loaded=wl, cpu_quiet=cq, cpu_loaded=cl, others_quiet=oq, others_loaded=ol,
        slowdown=slowdown, cpu_change=cl / cq - 1.0, lost_share=lost / total if total > 0 else 0.0,
        sampled=sampled, message=message,
    )


QUIET_MIN = 0.3
"""Share of the steps (and at least 30) that must be quiet for the trend to be judged on them
alone."""


def robust_step_times(
    wall: np.ndarray, cpu: np.ndarray, phases: dict[str, np.ndarray], loaded: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], str] | None:
    """(mask of the steps kept, step times, phase times, basis) with the machine's load taken
    out, or None when nothing can take it out (no load seen and no CPU times).

    "quiet": with steps under other processes' load (`loaded`, from loaded_mask) and enough
    quiet steps (QUIET_MIN), the loaded steps are dropped: their wall time says how busy the
    machine was, not how fast the script is, and even their CPU time is inflated (threads
    that spin while they wait for a descheduled sibling). "cpu": otherwise each step's CPU
    time, times the run's median wall/CPU ratio (so it reads in the usual wall seconds: a step
    that waits for data half of the time keeps that half), each phase its share of it.
    """
    w = np.asarray(wall, dtype=np.float64).ravel()
    c = np.asarray(cpu, dtype=np.float64).ravel()
    if w.size != c.size:
        return None
    phases = {name: np.asarray(v, dtype=np.float64).ravel() for name, v in phases.items()
              if np.asarray(v).size == w.size}
    if loaded is not None and np.asarray(loaded).size == w.size and np.any(loaded):
        quiet = ~np.asarray(loaded, dtype=bool)
        if quiet.sum() >= max(30, QUIET_MIN * w.size):
            return quiet, w[quiet], {k: v[quiet] for k, v in phases.items()}, "quiet"
    ok = np.isfinite(w) & np.isfinite(c) & (w > 0) & (c > 0)
    if ok.sum() < max(10, w.size // 2):
        return None
    ratio = float(np.median(w[ok] / c[ok]))
    robust = np.where(ok, c * ratio, w)
    scale = np.where(ok, robust / np.where(w > 0, w, 1.0), 1.0)
    return np.ones(w.size, dtype=bool), robust, {k: v * scale for k, v in phases.items()}, "cpu"


@dataclass(kw_only=True, slots=True)
class Rate:
    """A robust linear rate of a series over the steps."""

    per_1000: float
    """Units per 1,000 steps (Theil-Sen slope)."""
    first: float
    """Fitted value at the first step."""
    last: float
    """Fitted value at the last step."""
    z: float
    """Rise over the run in standard errors of the noise."""


def linear_rate(steps: np.ndarray, values: np.ndarray, *, min_points: int = 10) -> Rate | None:
    """Theil-Sen slope of `values` over `steps` (spikes clipped), or None with too few points.
    Constant stretches (RSS read once per log interval) are kept: the slope of a staircase is
    its rise."""
    x = np.asarray(steps, dtype=np.float64).ravel()
    y = np.asarray(values, dtype=np.float64).ravel()
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size < min_points:
        return None
    yc = robust_clip(y)
    slope, intercept = theil_sen(x, yc)
    if not np.isfinite(slope):
        return None
    resid = yc - (intercept + slope * x)
    sigma = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
    span = float(x[-1] - x[0])
    sxx = float(((x - x.mean()) ** 2).sum())
    se = 1.1 * sigma / math.sqrt(sxx) * span if sxx > 0 and sigma > 0 else 0.0
    rise = slope * span
    z = rise / se if se > 0 else (math.inf if rise > 0 else 0.0)
    return Rate(per_1000=slope * 1000.0, first=intercept + slope * x[0], last=intercept + slope * x[-1], z=z)
