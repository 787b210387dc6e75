"""How busy the GPU was over the measured steps, never over the life of the process.

NVML's utilization ("a kernel was running during the last sample period") read by the system
sampler covers everything the process did: imports, CUDA start, model build, compile, the
warm-up. Averaged over those, a GPU at 65 % MFU read "busy 11 %". Here only the sampler rows
taken inside the window of the measured steps (the first measured step's start to the last
one's end, wall clock, as `t_wall - t_step` of the step records) count, and a figure below the
MFU is rejected: at MFU m the device did m of its peak work, so it cannot have been busy less
than m of the time; a lower reading means the rows do not represent the steps (too few, or
the driver's own averaging period reaching outside a short window).
"""

from __future__ import annotations

from typing import Any

import numpy as np

MIN_SAMPLES = 2
"""Fewer sampler rows inside the window than this: no busy figure (one row is one NVML average
over a period the driver chooses, 1/6 s to 1 s, which may reach outside a short window)."""


def busy_window(t_wall: np.ndarray, t_step: np.ndarray, keep: np.ndarray) -> tuple[float, float] | None:
    """(start, end) wall-clock seconds of the measured steps (`keep`), or None when there are none."""
    t_wall = np.asarray(t_wall, dtype=np.float64)
    t_step = np.asarray(t_step, dtype=np.float64)
    ok = np.asarray(keep, dtype=bool) & np.isfinite(t_wall) & np.isfinite(t_step)
    if not ok.any():
        return None
    return float(np.min(t_wall[ok] - t_step[ok])), float(np.max(t_wall[ok]))


def gpu_busy(window: tuple[float, float] | None, sample_t: np.ndarray, util: np.ndarray,
             mfu: float | None = None) -> dict[str, Any] | None:
    """{"value": share of the time a kernel ran (0..1), "samples", "window_s", "valid", "basis"
    [, "note"]} from the NVML rows inside `window` (util in %, as NVML gives it); None when the
    run has no GPU reading. `valid` is False when fewer than MIN_SAMPLES rows fall inside or
    the value lies below the MFU (see the module's note)."""
    t = np.asarray(sample_t, dtype=np.float64).ravel()
    u = np.asarray(util, dtype=np.float64).ravel()
    if t.size != u.size or not np.isfinite(u).any() or window is None:
        return None
    start, end = window
    inside = np.isfinite(t) & np.isfinite(u) & (t > start) & (t <= end)
    n = int(inside.sum())
    out: dict[str, Any] = {"value": float(u[inside].mean() / 100.0) if n else None, "samples": n,
                           "window_s": max(0.0, end - start), "valid": n >= MIN_SAMPLES,
                           "basis": f"NVML utilization, {n} samples inside the measured steps ({end - start:.1f} s)"}
    if n < MIN_SAMPLES:
        out["note"] = f"{n} NVML sample(s) inside the measured steps, fewer than {MIN_SAMPLES}: no busy figure"
    elif mfu is not None and out["value"] + 0.02 < mfu:
        out["valid"] = False
        out["note"] = (f"NVML read {out['value']:.0%} busy while the MFU is {mfu:.0%}: a device cannot do "
                       "more of its peak work than the share of time it is busy, so the samples do not "
                       "represent the steps")
    return out


def busy_of(summary: dict[str, Any] | None) -> float | None:
    """The valid GPU busy share of a summary, or None."""
    found = (summary or {}).get("gpu_busy")
    if isinstance(found, dict) and found.get("valid") and isinstance(found.get("value"), (int, float)):
        return float(found["value"])
    return None


__all__ = ["MIN_SAMPLES", "busy_of", "busy_window", "gpu_busy"]
