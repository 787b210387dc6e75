"""Per-rank figures of a data-parallel run and straggler detection (pure functions).

Layout in the run directory: rank 0 writes `steps.jsonl` / `events.jsonl` as in a single-process
run; rank r > 0 writes the same files under `ranks/rank<r>/`. Rank 0 aggregates: its summary
(report.json) carries a `ranks` table built from all of them.

In synchronous data parallelism every step ends at the same collective, so total step times
are nearly equal on all ranks; a slow rank shows up as *time before the collective* (its data
wait, its forward) while the fast ranks spend the difference waiting inside backward /
optimizer. So a straggler is judged on its median "busy" time, data + h2d + forward,
the work each rank does alone, and separately on its data wait.

On a small run on a shared machine both figures are noisy (a 2-rank run of 200 ms steps read
data waits of 4-40 ms per step on either rank), and the medians of two ranks differ by 40-60 %
with nothing wrong. A verdict therefore needs all of: enough measured steps (MIN_STEPS), an
excess over the other ranks' median above the ratio (STRAGGLER_THRESHOLD), above 1 ms
(MIN_SECONDS) and above a share of the step (MIN_STEP_SHARE), and a rank that is slower at
nearly every step, not only on the median (CONSISTENT_SHARE: steps are paired by number, since
every rank's step k ends at the same collective).
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
MIN_STEP_SHARE = 0.05
"""Nor are differences below 5 % of the rank's median step time: that is all a straggler of
that size costs the other ranks, and a shared machine's noise is larger."""
MIN_STEPS = 8
"""Measured (non-warm-up) steps each compared rank needs for a verdict: with CONSISTENT_SHARE,
7 of 8 steps slower, which two equal ranks show by chance at 9 in 256 (a coin flip per step)."""
CONSISTENT_SHARE = 0.8
"""A straggler is slower than the other ranks' median at the same step in at least 80 % of the
steps; noise between equal ranks is slower at about half of them."""
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


def _measured(steps: Sequence[dict[str, Any]]) -> np.ndarray:
    """Mask of the measured (non-warm-up) steps; all of them when every step was warm-up."""
    warm = _field(steps, "warmup") > 0.5
    return ~warm if (~warm).any() else np.ones(len(steps), dtype=bool)


def _local(steps: Sequence[dict[str, Any]]) -> np.ndarray:
    """Each step's own work: the LOCAL_PHASES summed (a missing phase counts 0)."""
    return sum((np.nan_to_num(_field(steps, "phases", p)) for p in LOCAL_PHASES), np.zeros(len(steps)))


def rank_figures(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median figures of one rank over its measured (non-warm-up) steps."""
    keep = _measured(steps)
    t_step = _field(steps, "t_step")[keep]
    data = _field(steps, "phases", "data")[keep]
    local = _local(steps)[keep]
    total = float(np.nansum(t_step))
    return {
        "steps": len(steps),
        "measured_steps": int(keep.sum()),
        "step_time_p50": _median(t_step),
        "data_wait_p50": _median(data),
        "data_share": float(np.nansum(data)) / total if total > 0 else None,
        "local_p50": _median(local) if len(local) else None,
    }


def per_step(steps: Sequence[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """{"local": {step: own work}, "data": {step: data wait}} over the measured steps, keyed by
    step number (what pairs the ranks' records: step k of every rank ends at one collective)."""
    keep = _measured(steps)
    numbers = _field(steps, "step")
    out: dict[str, dict[int, float]] = {}
    for name, values in (("local", _local(steps)), ("data", _field(steps, "phases", "data"))):
        out[name] = {int(n): float(v) for n, v, k in zip(numbers, values, keep)
                     if k and np.isfinite(n) and np.isfinite(v)}
    return out


def find_stragglers(values: dict[int, float | None], threshold: float = STRAGGLER_THRESHOLD,
                    min_seconds: float = MIN_SECONDS, *, step_times: dict[int, float | None] | None = None,
                    min_step_share: float = MIN_STEP_SHARE) -> dict[int, float]:
    """{rank: excess over the other ranks' median, as a fraction} for ranks above it by more
    than `threshold`, by at least `min_seconds` and, where `step_times` gives the rank's median
    step, by at least `min_step_share` of it. Needs 2+ ranks with a value. (Against the others,
    not all ranks: with 2 ranks the median of all would sit halfway to the slow one.)"""
    known = {r: v for r, v in values.items() if v is not None and np.isfinite(v)}
    if len(known) < 2:
        return {}
    out: dict[int, float] = {}
    for r, v in known.items():
        med = float(np.median([w for q, w in known.items() if q != r]))
        step = (step_times or {}).get(r)
        floor = max(min_seconds, min_step_share * step if step is not None and np.isfinite(step) else 0.0)
        if v - med >= floor and (med <= 0 or (v - med) / med > threshold):
            out[r] = (v - med) / med if med > 0 else float("inf")
    return out


def slower_share(series: dict[int, dict[int, float]], rank: int) -> tuple[float, int]:
    """(share of the steps at which `rank`'s value exceeds the median of the other ranks' values
    at the same step, number of steps compared): the steps `rank` and another rank recorded."""
    own = series.get(rank) or {}
    slower = compared = 0
    for step, value in own.items():
        others = [s[step] for r, s in series.items() if r != rank and step in s]
        if others:
            compared += 1
            slower += value > float(np.median(others))
    return (slower / compared if compared else 0.0), compared


def rank_table(steps_by_rank: dict[int, Sequence[dict[str, Any]]],
               threshold: float = STRAGGLER_THRESHOLD) -> list[dict[str, Any]]:
    """One row per rank: its figures plus straggler flags on local work and on data wait, each
    with its reason ("data wait +800% at 11 of 11 steps") and the largest excess in seconds."""
    figs = {r: rank_figures(s) for r, s in sorted(steps_by_rank.items())}
    series = {r: per_step(s) for r, s in steps_by_rank.items()}
    step_times = {r: f["step_time_p50"] for r, f in figs.items()}
    reasons: dict[int, list[str]] = {r: [] for r in figs}
    excess: dict[int, float] = {}
    for key, name, label in (("local_p50", "local", "own work"), ("data_wait_p50", "data", "data wait")):
        medians = {r: f[key] for r, f in figs.items()}
        for r, ratio in find_stragglers(medians, threshold, step_times=step_times).items():
            share, compared = slower_share({q: s[name] for q, s in series.items()}, r)
            if compared < MIN_STEPS or share < CONSISTENT_SHARE:
                continue  # too few steps to tell, or slower on the median only: noise
            reasons[r].append(f"{label} {ratio:+.0%} at {round(share * compared)} of {compared} steps")
            others = [v for q, v in medians.items() if q != r and v is not None and np.isfinite(v)]
            excess[r] = max(excess.get(r, 0.0), float(medians[r]) - float(np.median(others)))
    return [{"rank": r, **f, "straggler": bool(reasons[r]), "why": "; ".join(reasons[r]) or None,
             "excess_s": excess.get(r)} for r, f in figs.items()]


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
