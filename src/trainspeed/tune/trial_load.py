"""How much of the machine other processes held while a trial's measured steps ran.

Averaged over the time the steps took, not over the steps. A trial that shares two cores with a
busy neighbour runs its steps fast while the neighbour waits and slowly while it runs: most of
its steps, by count, fall in the quiet moments. word_language_model's baseline trial beside a
test run took 75 s where its neighbours took 10 s; the sampler read other processes at ~100 % of
a core for most of those 75 s, yet the median over its 329 steps read 8 %, its 5x slower cost
was compared as a quiet trial's, and a null log-interval setting read 3.57x "faster".
"""

from __future__ import annotations

from typing import Any

import numpy as np


def trial_others_load(run: Any, keep: np.ndarray) -> float | None:
    """Other processes' mean CPU, in cores, over the wall time of the `keep` steps (the sampler
    rows that end inside it); None where the sampler has no row there."""
    from trainspeed.telemetry.summary import system_series

    series = system_series(run)
    if "cpu_others" not in series or not keep.any():
        return None
    return time_weighted_load(run.array("t_wall")[keep], run.array("t_step")[keep], series["t"], series["cpu_others"])


def time_weighted_load(ends: Any, steps: Any, sample_t: Any, others: Any) -> float | None:
    """Pure: the mean of `others` (% of one core, a sampler row each, at `sample_t`) over the
    window from the first step's start (`ends - steps`) to the last step's end, each row weighted
    by the span it covers inside the window; in cores. None without a row inside."""
    ends, steps = np.asarray(ends, dtype=np.float64), np.asarray(steps, dtype=np.float64)
    if not (np.isfinite(ends).any() and np.isfinite(steps).any()):
        return None
    start, end = float(np.nanmin(ends - np.nan_to_num(steps))), float(np.nanmax(ends))
    t, values = np.asarray(sample_t, dtype=np.float64), np.asarray(others, dtype=np.float64)
    inside = (t > start) & (t <= end) & np.isfinite(values)
    if not inside.any():
        return None
    previous = np.concatenate([[start], t[:-1]])  # each row covers the time since the one before
    span = np.clip(t - np.maximum(previous, start), 0.0, None)[inside]
    if span.sum() <= 0:
        return float(np.mean(values[inside])) / 100
    return float(np.sum(values[inside] * span) / np.sum(span)) / 100


__all__ = ["time_weighted_load", "trial_others_load"]
