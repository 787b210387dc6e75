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
"""

from __future__ import annotations

from typing import Any

import numpy as np

EVENT = "update_losses"


def _events(run: Any) -> list[dict[str, Any]]:
    """The run's update_losses events (none for a bare object with steps only, as plots get)."""
    return [e for e in getattr(run, "events", None) or [] if isinstance(e, dict) and e.get("type") == EVENT]


def update_losses(run: Any) -> dict[str, np.ndarray]:
    """{optimizer name: its loss per step record of `run` (aligned with run.steps, NaN where
    none)}, in the order the run named them; {} unless the run recorded two or more."""
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
    return out if len(out) >= 2 else {}


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
        out[name] = {**figures, "nonfinite": nonfinite.get(name, 0)}
    return out


__all__ = ["EVENT", "loss_figures", "losses_summary", "nonfinite_counts", "update_losses"]
