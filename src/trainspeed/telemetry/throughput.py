"""Throughput and MFU math: pure functions on per-step arrays (numpy only, no torch).

The Monitor and the report call these on arrays read back from steps.jsonl; keeping the
math free of torch and of any clock makes it testable on hand-computed numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from trainspeed.errors import ConfigError

__all__ = ["percentiles", "ThroughputStats", "throughput", "MfuResult", "mfu"]


def percentiles(x: np.ndarray | Sequence[float], qs: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
    """Percentiles of the finite values of `x`, keyed "p50", "p90", ...

    NaN/Inf entries (steps whose time was not resolved) are ignored; an array with no finite
    value gives {} so callers can tell "no data" from "zero".
    """
    arr = np.asarray(x, dtype=np.float64).ravel()
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return {}
    values = np.percentile(arr, list(qs))
    return {_pct_key(q): float(v) for q, v in zip(qs, values)}


def _pct_key(q: float) -> str:
    return f"p{int(q)}" if float(q).is_integer() else f"p{q:g}"


@dataclass(kw_only=True, slots=True)
class ThroughputStats:
    """Steady-state throughput over the measured (non-warm-up) steps."""

    steps: int
    """Number of steps that entered the figures (after removing excluded and unresolved ones)."""
    seconds: float
    """Sum of the kept step times, in seconds."""
    samples_per_s: float | None
    """sum(samples) / sum(step_times) over the kept steps; None when no time was measured."""
    tokens_per_s: float | None
    """sum(tokens) / sum(step_times); None when tokens were not given (or all NaN)."""
    step_time_p50: float | None
    """Median step time in seconds."""
    step_time_p90: float | None
    """90th percentile step time in seconds."""
    step_time_p99: float | None
    """99th percentile step time in seconds."""
    step_time_mean: float | None
    """Mean step time in seconds."""

    def as_dict(self) -> dict[str, float | int | None]:
        return {name: getattr(self, name) for name in self.__slots__}


def _per_step(name: str, values: np.ndarray | Sequence[float] | float, n: int) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 0:
        return np.full(n, float(arr))
    arr = arr.ravel()
    if arr.size != n:
        raise ConfigError(f"throughput: {name} has {arr.size} entries but step_times has {n}; pass one value per step")
    return arr


def throughput(
    step_times: np.ndarray | Sequence[float],
    samples: np.ndarray | Sequence[float] | float,
    tokens: np.ndarray | Sequence[float] | float | None = None,
    exclude: np.ndarray | Sequence[bool] | None = None,
) -> ThroughputStats:
    """Throughput over the kept steps.

    `exclude` (bool per step, True = drop) removes warm-up/compile steps first. Steps whose
    time is not finite (unresolved timers) are dropped too, together with their samples, so
    numerator and denominator always cover the same steps. A scalar `samples`/`tokens` means
    the same count every step.
    """
    t = np.asarray(step_times, dtype=np.float64).ravel()
    n = t.size
    s = _per_step("samples", samples, n)
    tok = None if tokens is None else _per_step("tokens", tokens, n)
    keep = np.isfinite(t)
    if exclude is not None:
        ex = np.asarray(exclude, dtype=bool).ravel()
        if ex.size != n:
            raise ConfigError(f"throughput: exclude has {ex.size} entries but step_times has {n}; pass one bool per step")
        keep &= ~ex
    kt = t[keep]
    seconds = float(kt.sum()) if kt.size else 0.0
    pct = percentiles(kt, (50, 90, 99))
    # No measured step counted a sample (a loop over a tensor it holds, no DataLoader, forwards
    # through `self.forward(x)`): the rate is unknown, not 0 samples/s
    counted = float(np.nansum(s[keep]))
    samples_per_s = counted / seconds if seconds > 0 and counted > 0 else None
    tokens_per_s = None
    if tok is not None and seconds > 0:
        kept_tokens = tok[keep]
        if np.isfinite(kept_tokens).any():
            tokens_per_s = float(np.nansum(kept_tokens) / seconds)
    return ThroughputStats(
        steps=int(kt.size),
        seconds=seconds,
        samples_per_s=samples_per_s,
        tokens_per_s=tokens_per_s,
        step_time_p50=pct.get("p50"),
        step_time_p90=pct.get("p90"),
        step_time_p99=pct.get("p99"),
        step_time_mean=float(kt.mean()) if kt.size else None,
    )


@dataclass(kw_only=True, slots=True)
class MfuResult:
    """Model FLOPs utilization against a named peak."""

    value: float | None
    """Achieved / peak as a fraction (0.42 = 42 %); None when it cannot be computed."""
    peak_flops: float | None
    """The peak FLOP/s the value is relative to."""
    peak_name: str | None
    """Which peak that is, e.g. "NVIDIA H100 SXM bf16 (table)" or "cpu fp32 (measured matmul)"."""
    valid: bool
    """False when the value is missing or impossible (> 100 %); then it must not be shown as a result."""
    note: str
    """Why the value is invalid, or an empty string."""

    def as_dict(self) -> dict[str, float | str | bool | None]:
        return {name: getattr(self, name) for name in self.__slots__}


COMPUTE_BOUND_MFU = 0.5
"""A step at this share of the device's peak or more is mostly the model's own arithmetic:
switches that remove overhead (data waits, launches, host syncs, logging) have little left to
remove (the doctor's compute_bound finding, the tuner's note when nothing won)."""


def mfu(
    flops_per_step: float | None,
    step_time_s: float | None,
    peak_flops: float | None,
    peak_name: str | None = None,
) -> MfuResult:
    """achieved FLOP/s = flops_per_step / step_time_s; MFU = achieved / peak_flops.

    A value above 1.0 is physically impossible: it means the FLOP count or the peak is wrong
    (e.g. a sparsity peak, or FLOPs counted for a larger batch). It is returned with
    valid=False and a note saying so, never as a result.
    """

    def _bad(x: float | None) -> bool:
        return x is None or not math.isfinite(x) or x <= 0

    if _bad(flops_per_step):
        return MfuResult(value=None, peak_flops=peak_flops, peak_name=peak_name, valid=False, note="FLOPs per step unknown")
    if _bad(peak_flops):
        return MfuResult(value=None, peak_flops=peak_flops, peak_name=peak_name, valid=False, note="peak FLOP/s unknown for this device")
    if _bad(step_time_s):
        return MfuResult(value=None, peak_flops=peak_flops, peak_name=peak_name, valid=False, note="no measured step time")
    value = float(flops_per_step) / float(step_time_s) / float(peak_flops)
    if value > 1.0:
        note = (
            f"measurement error: computed MFU {value * 100:.0f} % exceeds 100 % of {peak_name or 'the peak'}; "
            "the FLOP count per step or the peak FLOP/s is wrong (not a result)"
        )
        return MfuResult(value=value, peak_flops=peak_flops, peak_name=peak_name, valid=False, note=note)
    return MfuResult(value=value, peak_flops=peak_flops, peak_name=peak_name, valid=True, note="")
