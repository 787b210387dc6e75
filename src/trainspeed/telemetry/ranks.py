"""Per-rank figures of a data-parallel run and straggler detection (pure functions).

Layout in the run directory: rank 0 writes `steps.jsonl` / `events.jsonl` as in a single-process
run; rank r > 0 writes the same files under `ranks/rank<r>/`. Rank 0 aggregates: its summary
(report.json) carries a `ranks` table built from all of them.

In synchronous data parallelism every step ends at the same collective, so total step times
are nearly equal on all ranks; a slow rank shows up as *time before the collective* (its data
wait, its forward) while the fast ranks spend the difference waiting inside backward /
optimizer. So a straggler is judged on its median "busy" time, data + h2d + forward,
the work each rank does alone, and separately on its data wait.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

RANKS_DIR = "ranks"
STRAGGLER_THRESHOLD = 0.20
"""A rank is a straggler when its median local work exceeds the median of the other ranks by
more than 20 %: below that, run-to-run noise on a shared machine is of the same size."""
MIN_SECONDS = 1e-3
"""Differences below 1 ms per step are not worth a finding, whatever the ratio."""
LOCAL_PHASES = ("data", "h2d", "forward")
"""Phases each rank runs without waiting for the others (DDP's all-reduce hides in backward,
FSDP's all-gathers in forward too, so forward is only an approximation under FSDP)."""

_RANK_RE = re.compile(r"^rank(\d+)$")


def rank_dir(run_dir: str | Path, rank: int) -> Path:
    """Directory in which rank `rank` writes its step records."""
    run_dir = Path(run_dir)
    return run_dir if rank == 0 else run_dir / RANKS_DIR / f"rank{rank}"


def rank_dirs(run_dir: str | Path) -> dict[int, Path]:
    """{rank: directory} of the ranks r > 0 present under `ranks/`, sorted by rank."""
    base = Path(run_dir) / RANKS_DIR
    found: dict[int, Path] = {}
    if base.is_dir():
        for child in base.iterdir():
            m = _RANK_RE.match(child.name)
            if m and child.is_dir():
                found[int(m.group(1))] = child
    return dict(sorted(found.items()))


def _median(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else None


def _field(steps: Sequence[dict[str, Any]], *path: str) -> np.ndarray:
    out = np.full(len(steps), np.nan)
    for i, record in enumerate(steps):
        value: Any = record
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            out[i] = float(value)
    return out


def rank_figures(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median figures of one rank over its measured (non-warm-up) steps."""
    warm = _field(steps, "warmup") > 0.5
    keep = ~warm if (~warm).any() else np.ones(len(steps), dtype=bool)
    t_step = _field(steps, "t_step")[keep]
    data = _field(steps, "phases", "data")[keep]
    local = sum((np.nan_to_num(_field(steps, "phases", p)[keep]) for p in LOCAL_PHASES),
                np.zeros(int(keep.sum())))
    total = float(np.nansum(t_step))
    return {
        "steps": len(steps),
        "step_time_p50": _median(t_step),
        "data_wait_p50": _median(data),
        "data_share": float(np.nansum(data)) / total if total > 0 else None,
        "local_p50": _median(local) if len(local) else None,
    }


def find_stragglers(values: dict[int, float | None], threshold: float = STRAGGLER_THRESHOLD,
                    min_seconds: float = MIN_SECONDS) -> dict[int, float]:
    """{rank: excess over the other ranks' median, as a fraction} for ranks above it by more
    than `threshold` and by at least `min_seconds`. Needs 2+ ranks with a value. (Against the
    others, not all ranks: with 2 ranks the median of all would sit halfway to the slow one.)"""
    known = {r: v for r, v in values.items() if v is not None and np.isfinite(v)}
    if len(known) < 2:
        return {}
    out: dict[int, float] = {}
    for r, v in known.items():
        med = float(np.median([w for q, w in known.items() if q != r]))
        if v - med >= min_seconds and (med <= 0 or (v - med) / med > threshold):
            out[r] = (v - med) / med if med > 0 else float("inf")
    return out


def rank_table(steps_by_rank: dict[int, Sequence[dict[str, Any]]],
               threshold: float = STRAGGLER_THRESHOLD) -> list[dict[str, Any]]:
    """One row per rank: its figures plus straggler flags on local work and on data wait."""
    figs = {r: rank_figures(s) for r, s in sorted(steps_by_rank.items())}
    slow_local = find_stragglers({r: f["local_p50"] for r, f in figs.items()}, threshold)
    slow_data = find_stragglers({r: f["data_wait_p50"] for r, f in figs.items()}, threshold)
    rows = []
    for r, f in figs.items():
        reasons = []
        if r in slow_local:
            reasons.append(f"own work {slow_local[r]:+.0%}")
        if r in slow_data:
            reasons.append(f"data wait {slow_data[r]:+.0%}")
        rows.append({"rank": r, **f, "straggler": bool(reasons), "why": "; ".join(reasons) or None})
    return rows


def finished_ranks(run_dir: str | Path, world_size: int) -> list[int]:
    """Ranks r > 0 whose events.jsonl already holds their `run_end` event (their step
    records are then complete on disk)."""
    done = []
    for r in range(1, world_size):
        path = rank_dir(run_dir, r) / "events.jsonl"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        if '"type":"run_end"' in text or '"type": "run_end"' in text:
            done.append(r)
    return done


def wait_for_ranks(run_dir: str | Path, world_size: int, timeout_s: float = 30.0,
                   poll_s: float = 0.2) -> list[int]:
    """Rank 0 of a job without a process group to wait on (the doctor: the user's script owns
    it): wait until every other rank has closed its records, at most `timeout_s`.
    Returns the ranks that did not finish in time (their rows are then partial)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        missing = sorted(set(range(1, world_size)) - set(finished_ranks(run_dir, world_size)))
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(poll_s)
