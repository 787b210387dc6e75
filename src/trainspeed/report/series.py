"""Pure series math for the plots: step axis, rolling median, binning, throughput, trend line.

Inputs are a RunData-like object (anything with `.steps: list[dict]`); outputs are float numpy
arrays with NaN for absent values. No matplotlib here, so every function is tested on numbers.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from trainspeed.telemetry.rundir import step_array

from trainspeed.telemetry.schema import PHASES

# Step-record memory fields and their plot labels. The DataLoader-worker field has had more
# than one spelling in drafts of the schema; the first one present wins.
MEMORY_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("device allocated (peak)", ("mem.cuda_alloc_peak",)),
    ("device reserved (peak)", ("mem.cuda_reserved_peak",)),
    ("host RSS", ("mem.rss",)),
    ("DataLoader workers RSS", ("mem.worker_rss", "mem.workers_rss", "mem.rss_workers")),
)


def column(run: Any, key: str) -> np.ndarray:
    """Float array of a (dotted) step field; missing/null/non-numeric values are NaN."""
    return step_array(run.steps, key)


def first_column(run: Any, keys: tuple[str, ...]) -> np.ndarray:
    """The first of `keys` that has any finite value (else an all-NaN column)."""
    for key in keys:
        col = column(run, key)
        if np.isfinite(col).any():
            return col
    return np.full(len(run.steps), np.nan)


def has_data(y: np.ndarray) -> bool:
    return bool(y.size) and bool(np.isfinite(y).any())


def step_axis(run: Any) -> np.ndarray:
    """Step numbers; falls back to 0..n-1 where a record lacks one."""
    x = column(run, "step")
    missing = ~np.isfinite(x)
    if missing.any():
        x[missing] = np.arange(len(x), dtype=np.float64)[missing]
    return x


def rolling_median(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing rolling median ignoring NaN; the first window-1 points use what is available."""
    n = len(y)
    if n == 0:
        return y.astype(np.float64)
    window = max(1, min(int(window), n))
    padded = np.concatenate([np.full(window - 1, np.nan), y.astype(np.float64)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, window)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows -> NaN, on purpose
        return np.nanmedian(windows, axis=1)


def default_window(n: int) -> int:
    """Rolling window for n points: ~5% of the run, at least 3, at most 200."""
    return int(min(200, max(3, n // 20)))


def bin_slices(n: int, max_bins: int = 60) -> list[slice]:
    """Split n points into at most max_bins contiguous, nearly equal slices."""
    if n <= 0:
        return []
    nbins = min(n, max_bins)
    edges = np.linspace(0, n, nbins + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def binned(x: np.ndarray, ys: dict[str, np.ndarray], max_bins: int = 60) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Bin centers of x and the NaN-ignoring mean of each y per bin (NaN bins stay NaN)."""
    slices = bin_slices(len(x), max_bins)
    centers = np.array([float(np.mean(x[s])) for s in slices])
    out: dict[str, np.ndarray] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for name, y in ys.items():
            out[name] = np.array([np.nanmean(y[s]) if np.isfinite(y[s]).any() else np.nan for s in slices])
    return centers, out


def phase_bins(run: Any, max_bins: int = 60) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Mean seconds per phase per bin of steps, keeping only phases with nonzero time."""
    x = step_axis(run)
    cols = {p: column(run, f"phases.{p}") for p in PHASES}
    cols = {p: y for p, y in cols.items() if has_data(y) and float(np.nansum(y)) > 0}
    if not cols:
        return np.array([]), {}
    centers, means = binned(x, cols, max_bins)
    return centers, {p: np.nan_to_num(m, nan=0.0) for p, m in means.items()}


def throughput_series(run: Any, max_bins: int = 60) -> tuple[np.ndarray, np.ndarray, str]:
    """(bin centers, units per second, unit) over the run. Tokens/s when the run counts
    tokens, else samples/s. Rate per bin is sum(units) / sum(t_step): a ratio of sums, so
    one slow step weighs by its duration, as it does in reality. Warm-up steps are left out."""
    x = step_axis(run)
    t = column(run, "t_step")
    warm_mask = np.array([bool(r.get("warmup")) for r in run.steps], dtype=bool)
    unit, units = "tokens/s", column(run, "tokens")
    if not has_data(units) or float(np.nansum(units)) <= 0:
        unit, units = "samples/s", column(run, "samples")
    ok = np.isfinite(t) & np.isfinite(units) & (t > 0) & ~warm_mask
    if not ok.any():
        return np.array([]), np.array([]), unit
    x, t, units = x[ok], t[ok], units[ok]
    slices = bin_slices(len(x), max_bins)
    centers = np.array([float(np.mean(x[s])) for s in slices])
    rate = np.array([float(np.sum(units[s]) / np.sum(t[s])) for s in slices])
    return centers, rate, unit


def trend_line(x: np.ndarray, y: np.ndarray, since_step: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """Least-squares line through (x, y) for x >= since_step; None with fewer than 2 points.

    The summary's trend names where the change starts; the line is fitted here on the plotted
    data, so it lines up with the plot whatever units the summary's slope uses.
    """
    start = float(since_step) if isinstance(since_step, (int, float)) and not isinstance(since_step, bool) else float("-inf")
    ok = np.isfinite(x) & np.isfinite(y) & (x >= start)
    if ok.sum() < 2 or np.ptp(x[ok]) == 0:
        return None
    slope, intercept = np.polyfit(x[ok], y[ok], 1)
    xs = np.array([x[ok].min(), x[ok].max()])
    return xs, slope * xs + intercept
