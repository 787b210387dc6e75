"""Each optimizer's own loss, per step record, for runs that step several optimizers.

A step record holds one loss. A script with several optimizers (a GAN's optimizerD and
optimizerG) has one per optimizer, and one number for both is none of them: the doctor once
averaged dcgan's errG, errD_real and errD_fake into a curve neither network follows. Such a
run writes each optimizer's losses as "update_losses" events, one per log interval:

    {"type": "update_losses", "data": {"first_step": 21, "column": "optimizerD",
     "losses": {"optimizerD": [0.61, ...], "optimizerG": [2.4, null, ...]},
     "nonfinite": {"optimizerG": 1}}}

`losses[name][i]` belongs to the step record `first_step + i`; null where that optimizer made
no update in that step, or its loss was not finite (counted in `nonfinite`). `column` names the
optimizer whose loss the step records' own `loss` holds. Written by
doctor/instrument/update_losses.py; read here, so summaries and reports of any run directory
read each loss apart.

Optimizers stepped after one backward (a backbone's SGD and a head's AdamW over one model) share
that backward's loss: their series are equal, and are read as one loss named by all of them
("opt_backbone + opt_head"); where every optimizer shares one loss the run has one loss, as a
run with one optimizer (the report's one "loss" row, not the same figures twice).
"""

from __future__ import annotations

from typing import Any

import numpy as np

EVENT = "update_losses"
SHARED = " + "
"""Joins the names of optimizers that share one loss (members() splits them)."""


def _events(run: Any) -> list[dict[str, Any]]:
    """The run's update_losses events (none for a bare object with steps only, as plots get)."""
    return [e for e in getattr(run, "events", None) or [] if isinstance(e, dict) and e.get("type") == EVENT]


def optimizer_series(run: Any) -> dict[str, np.ndarray]:
    """{optimizer name: its loss per step record of `run` (aligned with run.steps, NaN where
    none)} as recorded, in the order the run named them; {} for a run without such events."""
    events = _events(run)
    if not events:
        return {}
    row_of = {int(r["step"]): i for i, r in enumerate(run.steps) if isinstance(r.get("step"), (int, float))}
    out: dict[str, np.ndarray] = {}
    for event in events:
        data = event.get("data") or {}
        first = data.get("first_step")
        losses = data.get("losses")
        if not isinstance(first, int) or not isinstance(losses, dict):
            continue
        for name, values in losses.items():
            series = out.setdefault(str(name), np.full(len(run.steps), np.nan))
            for k, value in enumerate(values if isinstance(values, list) else []):
                i = row_of.get(first + k)
                if i is not None and isinstance(value, (int, float)):
                    series[i] = float(value)
    return out


def update_losses(run: Any) -> dict[str, np.ndarray]:
    """optimizer_series() with the optimizers that share one loss read as one (module
    docstring); {} unless two or more losses remain."""
    out = _shared_merged(optimizer_series(run))
    return out if len(out) >= 2 else {}


def _shares(a: np.ndarray, b: np.ndarray) -> bool:
    """Two optimizers' series are one backward's loss: equal on every row both updated, and
    both updated on at least half the rows of the one that updated less (a run cut between
    the two updates leaves one row to one of them; a GAN's two losses are never equal)."""
    fa, fb = np.isfinite(a), np.isfinite(b)
    both = fa & fb
    overlap = int(both.sum())
    return overlap > 0 and overlap * 2 >= min(int(fa.sum()), int(fb.sum())) and bool(np.array_equal(a[both], b[both]))


def _shared_merged(series: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Series of one shared loss as one (each row from whichever updated), named by all the
    optimizers that share it, in the order the run named them."""
    groups: list[tuple[list[str], np.ndarray]] = []
    for name, values in series.items():
        group = next((g for g in groups if _shares(g[1], values)), None)
        if group is None:
            groups.append(([name], values.copy()))
        else:
            group[0].append(name)
            np.copyto(group[1], values, where=~np.isfinite(group[1]))
    return {SHARED.join(names): values for names, values in groups}


def members(name: str) -> list[str]:
    """The optimizers whose shared loss update_losses() names `name` (one name: itself)."""
    return name.split(SHARED)


def nonfinite_counts(run: Any) -> dict[str, int]:
    """{optimizer name: its updates whose loss was NaN or infinite} over the run."""
    counts: dict[str, int] = {}
    for event in _events(run):
        for name, n in ((event.get("data") or {}).get("nonfinite") or {}).items():
            counts[str(name)] = counts.get(str(name), 0) + int(n)
    return counts


def loss_figures(values: np.ndarray) -> dict[str, float] | None:
    """First, last and lowest finite value of a loss series (None: none is finite)."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return None
    return {"first": float(finite[0]), "last": float(finite[-1]), "min": float(finite.min())}


def losses_summary(run: Any) -> dict[str, dict[str, Any]]:
    """{optimizer name: first/last/min of its loss, and its non-finite updates}; {} for a run
    with one loss (its step records' `loss` says it all)."""
    nonfinite = nonfinite_counts(run)
    out: dict[str, dict[str, Any]] = {}
    for name, values in update_losses(run).items():
        figures = loss_figures(values) or {"first": None, "last": None, "min": None}
        out[name] = {**figures, "nonfinite": max(nonfinite.get(m, 0) for m in members(name))}
    return out


__all__ = ["EVENT", "SHARED", "loss_figures", "losses_summary", "members", "nonfinite_counts", "optimizer_series", "update_losses"]
