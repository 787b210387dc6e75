"""Step times compared per sample, when the steps themselves grow.

A step is one optimizer update, and in most loops every update sees the same batch. Not in a
reinforcement-learning loop whose step is an episode: pytorch/examples' reinforce.py runs one
forward per environment step and updates once per episode, and as the policy learns the
episodes lengthen (18 -> 336 environment steps in 200 updates). Its step time grew 28x over a
doctor run, read as "step time grows 2797 % per 1,000 steps, in phase 'other'", while its
time per environment step stayed level. When the samples per step change that much, a trend
is judged on the time per sample (scaled to the run's median step, so the figures stay step
times); with samples that stay put, nothing changes. Pure: arrays in, arrays out.
"""

from __future__ import annotations

import numpy as np

SAMPLES_CHANGE = 1.5
"""Samples per step whose last-quarter median is 1.5x the first quarter's (or 1/1.5x) make the
steps unlike one another: a DataLoader's short last batch moves no quarter's median."""
MIN_STEPS = 20
"""Steps the quarters need."""


def _quarters(values: np.ndarray) -> tuple[float, float] | None:
    n = values.size
    if n < MIN_STEPS:
        return None
    q = max(5, n // 4)
    return float(np.median(values[:q])), float(np.median(values[-q:]))


def work_factors(samples: np.ndarray) -> tuple[np.ndarray, tuple[float, float]] | None:
    """(each step's samples over the median step's, (first-quarter, last-quarter) median samples)
    when the samples per step changed by SAMPLES_CHANGE or more over the series, else None
    (samples unknown, missing on some step, or level)."""
    samples = np.asarray(samples, dtype=float)
    if samples.size == 0 or not np.all(np.isfinite(samples)) or not np.all(samples > 0):
        return None
    quarters = _quarters(samples)
    if quarters is None or quarters[0] <= 0:
        return None
    ratio = quarters[1] / quarters[0]
    if 1.0 / SAMPLES_CHANGE < ratio < SAMPLES_CHANGE:
        return None
    return samples / float(np.median(samples)), quarters


def per_sample(steps: np.ndarray, times: np.ndarray, phases: dict[str, np.ndarray],
               all_steps: np.ndarray, all_samples: np.ndarray
               ) -> tuple[np.ndarray, dict[str, np.ndarray], tuple[float, float]] | None:
    """(times, phases) divided by each step's work factor, and the samples' quarter medians,
    when the samples per step of the series' steps (looked up by step number in `all_steps`)
    changed by SAMPLES_CHANGE; None otherwise."""
    steps = np.asarray(steps)
    all_steps = np.asarray(all_steps)
    if steps.size == 0 or all_steps.size == 0:
        return None
    order = np.argsort(all_steps, kind="stable")
    at = np.searchsorted(all_steps[order], steps)
    if np.any(at >= all_steps.size) or np.any(all_steps[order][np.minimum(at, all_steps.size - 1)] != steps):
        return None
    found = work_factors(np.asarray(all_samples, dtype=float)[order][at])
    if found is None:
        return None
    factors, quarters = found
    return times / factors, {name: values / factors for name, values in phases.items()}, quarters


def describe(quarters: tuple[float, float]) -> str:
    """"compared per sample: the samples per step went 18 -> 169 (first vs last quarter)"."""
    return (f"compared per sample: the samples per step went {quarters[0]:.0f} -> {quarters[1]:.0f} "
            "(first vs last quarter's median)")
