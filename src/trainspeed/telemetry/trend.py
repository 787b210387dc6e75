"""Slowdown detection: does step time grow over the run, since when, and in which phase?

Pure numpy. Step times are noisy and heavy-tailed (GC pauses, logging spikes, other tenants),
so everything here is robust: spikes are clipped against a running median, slopes are
Theil-Sen (median of pairwise slopes), and a slowdown is reported only when it is both large
(>= `min_slowdown` of the baseline step time) and far outside the noise (z >= Z_MIN).

Two shapes are told apart:
  growth  flat until step c, then linear growth (a leak, a growing list, fragmentation)
  shift   a one-time jump in the mean at step k (a config switch, eval started, swap began)
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

__all__ = ["theil_sen", "change_point", "Trend", "detect_trend", "robust_clip"]

# z-score a slowdown must reach against the noise. Theil-Sen standard error is estimated
# from the data, and the onset is chosen to fit best, which inflates z under pure noise; 5 keeps
# false alarms negligible on iid noise while a 10 % growth over 500 steps at 10 % noise is z ~ 8.
Z_MIN = 5.0
# Change-point penalty: a split must explain this many noise variances (BIC-like, grows with log n).
_CP_PENALTY_BASE = 12.0
_SHIFT_MARGIN = 10.0
_MAX_POINTS = 2000  # series longer than this are reduced to medians of equal-size bins


def theil_sen(x: np.ndarray, y: np.ndarray, max_points: int = _MAX_POINTS) -> tuple[float, float]:
    """Theil-Sen line: slope = median of pairwise slopes, intercept = median(y - slope * x).

    Non-finite points are dropped. For more than `max_points` points an evenly spaced,
    deterministic subsample is used, so the pair count stays <= max_points^2 / 2. Returns
    (nan, nan) for fewer than 2 usable points.
    """
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size > max_points:
        idx = np.unique(np.linspace(0, x.size - 1, max_points).round().astype(np.int64))
        x, y = x[idx], y[idx]
    n = x.size
    if n < 2:
        return math.nan, math.nan
    # Pairwise slopes row by row into one preallocated array: memory O(n^2/2) floats, no n x n temporaries.
    slopes = np.empty(n * (n - 1) // 2, dtype=np.float64)
    pos = 0
    for i in range(n - 1):
        dx = x[i + 1 :] - x[i]
        dy = y[i + 1 :] - y[i]
        m = dx.size
        with np.errstate(divide="ignore", invalid="ignore"):
            slopes[pos : pos + m] = np.where(dx != 0, dy / dx, np.nan)
        pos += m
    slopes = slopes[np.isfinite(slopes)]
    if slopes.size == 0:  # all x equal
        return math.nan, math.nan
    slope = float(np.median(slopes))
    intercept = float(np.median(y - slope * x))
    return slope, intercept


def _running_median(y: np.ndarray, window: int) -> np.ndarray:
    if y.size < window:
        return np.full_like(y, np.median(y))
    half = window // 2
    # Reflect, not edge: edge padding copies the last value `half` times, so a spike at the very
    # end would become its own running median and escape clipping.
    padded = np.pad(y, (half, window - 1 - half), mode="reflect")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, window), axis=1)


def robust_clip(y: np.ndarray, k: float = 5.0, window: int = 21) -> np.ndarray:
    """Clip spikes: values further than k robust sigmas from a running median are pulled back.

    The running median follows trends and steps, so only isolated outliers are changed.
    """
    y = np.asarray(y, dtype=np.float64)
    if y.size < 3:
        return y.copy()
    base = _running_median(y, window)
    resid = y - base
    dev = np.abs(resid - np.median(resid))
    sigma = 1.4826 * float(np.median(dev))
    if not sigma > 0:  # mostly identical values (quantized timers): fall back to the mean deviation
        sigma = 1.2533 * float(np.mean(dev))
    if not sigma > 0:
        return y.copy()
    return base + np.clip(resid, -k * sigma, k * sigma)


def _noise_sigma(y: np.ndarray) -> float:
    """Per-point noise std from first differences: insensitive to trends and to a single shift."""
    if y.size < 3:
        return math.nan
    d = np.diff(y)
    return float(math.sqrt(np.mean(d * d) / 2.0))


def _best_split(y: np.ndarray, min_size: int) -> tuple[int | None, float]:
    """Split index k maximizing the between-segment sum of squares k(n-k)/n (mean_l - mean_r)^2."""
    n = y.size
    if n < 2 * min_size:
        return None, 0.0
    c = np.cumsum(y)
    k = np.arange(min_size, n - min_size + 1)
    left = c[k - 1] / k
    right = (c[-1] - c[k - 1]) / (n - k)
    gain = k * (n - k) / n * (left - right) ** 2
    i = int(np.argmax(gain))
    return int(k[i]), float(gain[i])


def change_point(y: np.ndarray, min_size: int = 20) -> int | None:
    """Index of the single most likely mean shift in y (first index of the new regime), or None.

    Binary segmentation, one split: the split must explain more than a BIC-like penalty of
    noise variances (noise from first differences of the spike-clipped series), so a stable
    noisy series gives None.
    """
    y = np.asarray(y, dtype=np.float64).ravel()
    y = y[np.isfinite(y)]
    n = y.size
    if n < 2 * max(1, min_size):
        return None
    yc = robust_clip(y)
    sigma = _noise_sigma(yc)
    k, gain = _best_split(yc, max(1, min_size))
    if k is None:
        return None
    if not sigma > 0:
        return k if gain > 0 else None
    if gain / sigma**2 <= _CP_PENALTY_BASE + 2.0 * math.log(n):
        return None
    return k


@dataclass(kw_only=True, slots=True)
class Trend:
    """A detected slowdown."""

    slope_per_1000: float
    """Step-time growth per 1,000 steps as a fraction of the baseline step time (0.1 = +10 %)."""
    since_step: int
    """Step at which the slowdown begins (onset of growth, or the jump)."""
    phase: str | None
    """The phase whose own growth explains most of it, or None when no single phase does."""
    baseline: float
    """Typical step time (s) before the slowdown."""
    message: str
    """One sentence for humans."""
    kind: str = "growth"
    """"growth" (steady increase) or "shift" (one-time jump)."""
    change: float = 0.0
    """Total increase from the baseline to the end of the run, as a fraction of the baseline."""
    z: float = 0.0
    """How far outside the noise the change is (in standard errors)."""


def _bin(x: np.ndarray, arrays: list[np.ndarray], max_points: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Reduce long series to medians of consecutive bins (kills spikes, bounds the cost)."""
    n = x.size
    if n <= max_points:
        return x, arrays
    size = math.ceil(n / (max_points // 2))
    nb = n // size
    cut = nb * size

    def med(a: np.ndarray) -> np.ndarray:
        with warnings.catch_warnings():  # an all-NaN bin (unresolved timers) is NaN, not a warning
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmedian(a[:cut].reshape(nb, size), axis=1)

    return med(x), [med(a) for a in arrays]


def _hinge_onset(x: np.ndarray, y: np.ndarray, min_size: int) -> tuple[int, float]:
    """Index c minimizing the SSE of y ~ a + b * max(0, x - x[c]); returns (c, sse)."""
    n = x.size
    cands = np.unique(np.linspace(0, n - min_size, min(n - min_size + 1, 200)).round().astype(np.int64))
    best_c, best_sse = 0, math.inf
    for c in cands:
        h = np.maximum(0.0, x - x[c])
        hm, ym = h.mean(), y.mean()
        shh = float(((h - hm) ** 2).sum())
        if shh <= 0:
            continue
        b = float(((h - hm) * (y - ym)).sum()) / shh
        a = ym - b * hm
        sse = float(((y - a - b * h) ** 2).sum())
        if sse < best_sse:
            best_c, best_sse = int(c), sse
    return best_c, best_sse


def _step_sse(y: np.ndarray, k: int) -> float:
    return float(((y[:k] - y[:k].mean()) ** 2).sum() + ((y[k:] - y[k:].mean()) ** 2).sum())


def _phase_share(
    phases: dict[str, np.ndarray] | None, keep: np.ndarray, x: np.ndarray, start: int, total_effect: float, kind: str, max_points: int
) -> str | None:
    """Name the phase whose own change explains most (>= half) of the step-time change."""
    if not phases or total_effect <= 0:
        return None
    best_name, best_effect = None, 0.0
    for name, values in phases.items():
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size != keep.size:
            continue
        v = v[keep]
        _, (v,) = _bin(np.arange(v.size, dtype=np.float64), [v], max_points)
        if not np.isfinite(v).sum() >= 10:
            continue
        v = np.where(np.isfinite(v), v, np.nan)
        if kind == "growth":
            slope, _ = theil_sen(x[start:], v[start:])
            effect = slope
        else:
            effect = float(np.nanmedian(v[start:]) - np.nanmedian(v[:start]))
        if np.isfinite(effect) and effect > best_effect:
            best_name, best_effect = name, effect
    return best_name if best_effect >= 0.5 * total_effect else None


def detect_trend(
    steps: np.ndarray,
    step_times: np.ndarray,
    phases: dict[str, np.ndarray] | None = None,
    *,
    min_slowdown: float = 0.03,
    min_steps: int = 100,
) -> Trend | None:
    """A slowdown of at least `min_slowdown` (fraction of baseline) that stands out of the noise, or None.

    `steps` and `step_times` are per-record arrays (warm-up already removed by the caller);
    `phases` maps phase name -> per-record seconds, used only to name the culprit.
    """
    x = np.asarray(steps, dtype=np.float64).ravel()
    y = np.asarray(step_times, dtype=np.float64).ravel()
    if x.size != y.size:
        return None
    keep = np.isfinite(x) & np.isfinite(y)
    if int(keep.sum()) < max(min_steps, 40):
        return None
    xk, (yk,) = _bin(x[keep], [y[keep]], _MAX_POINTS)
    n = yk.size
    min_size = max(10, n // 10)
    yc = robust_clip(yk)
    sigma = _noise_sigma(yc)
    level = float(np.median(yc))
    if not (level > 0 and np.isfinite(sigma)):
        return None
    sigma = max(sigma, 1e-6 * level)

    c, sse_hinge = _hinge_onset(xk, yc, min_size)
    k, _ = _best_split(yc, min_size)
    sse_step = _step_sse(yc, k) if k is not None else math.inf

    # A ramp is often fitted about as well by a step; call it a shift only when the step model is
    # clearly better (by more than _SHIFT_MARGIN noise variances), else keep the growth reading.
    if k is not None and sse_hinge - sse_step > _SHIFT_MARGIN * sigma**2:
        found = _as_shift(xk, yc, k, sigma, min_slowdown)
        start = k
    else:
        found = _as_growth(xk, yc, c, sigma, min_slowdown, min_size)
        start = c
    if found is None:
        return None
    kind, baseline, slope, change, z = found
    effect = slope if kind == "growth" else change * baseline
    phase = _phase_share(phases, keep, xk, start, effect, kind, _MAX_POINTS)
    since = int(round(xk[start]))
    where = f", in phase '{phase}'" if phase else ""
    if kind == "growth":
        per_1000 = slope * 1000.0 / baseline
        message = f"step time grows {per_1000 * 100:.1f} % per 1,000 steps since step {since}{where}"
    else:
        per_1000 = max(0.0, theil_sen(xk, yc)[0]) * 1000.0 / baseline
        message = (
            f"step time jumped {change * 100:.1f} % at step {since} "
            f"({baseline * 1e3:.2f} ms -> {baseline * (1 + change) * 1e3:.2f} ms){where}"
        )
    return Trend(
        slope_per_1000=per_1000, since_step=since, phase=phase, baseline=baseline,
        message=message, kind=kind, change=change, z=z,
    )


def _as_growth(x, y, c, sigma, min_slowdown, min_size):
    seg_x, seg_y = x[c:], y[c:]
    if seg_x.size < min_size:
        return None
    slope, intercept = theil_sen(seg_x, seg_y)
    if not np.isfinite(slope) or slope <= 0:
        return None
    # Baseline: the flat level before the onset, else the fitted value at the onset.
    baseline = float(np.median(y[:c])) if c >= 10 else float(intercept + slope * seg_x[0])
    if not baseline > 0:
        return None
    span = float(seg_x[-1] - seg_x[0])
    rise = slope * span
    sxx = float(((seg_x - seg_x.mean()) ** 2).sum())
    se_rise = 1.1 * sigma / math.sqrt(sxx) * span if sxx > 0 else math.inf  # Theil-Sen ~ OLS efficiency
    z = rise / se_rise
    # Confirmation that does not rely on the line: the end of the run really is slower.
    tail = max(10, seg_y.size // 5)
    late = float(np.median(seg_y[-tail:]))
    change = (late - baseline) / baseline
    if rise / baseline < min_slowdown or z < Z_MIN or change < 0.5 * min_slowdown:
        return None
    return "growth", baseline, slope, change, z


def _as_shift(x, y, k, sigma, min_slowdown):
    before, after = y[:k], y[k:]
    baseline = float(np.median(before))
    if not baseline > 0:
        return None
    jump = float(np.median(after)) - baseline
    se = 1.2533 * sigma * math.sqrt(1.0 / before.size + 1.0 / after.size)  # s.e. of a median difference
    z = jump / se
    change = jump / baseline
    if change < min_slowdown or z < Z_MIN:
        return None
    return "shift", baseline, 0.0, change, z
