"""Each optimizer's own parity loss, read from a trial that stepped several (a GAN's optimizerD
and optimizerG).

A trial's `loss` is the primary optimizer's (the step records' loss column: on dcgan, D's), and
parity once compared only that: a setting that broke the generator's training passed, its
discriminator's loss unchanged. The doctor records every optimizer's loss apart ("update_losses"
events, telemetry/update_losses.py); here each becomes a figure like the primary's: the mean of
the last quarter of the trial's step records (inf where an update's loss in that quarter was not
finite: a diverged network is what parity must catch), and the mean of its first logged losses,
the scale parity.py weighs a near-zero difference on. A trial with one optimizer has none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

START_STEPS = 5
"""Losses averaged into an optimizer's starting loss (as trials.py's for the primary)."""
MIN_TAIL = 4
"""Fewer finite per-step losses than this in a tail give no scatter (tail_scatter)."""


def tail_scatter(tail: np.ndarray) -> float | None:
    """How much a tail's mean loss moves with the particular batches it averaged: the standard
    error of that mean (the per-step losses' standard deviation over sqrt(n)), relative to it.
    Any change of the numerics (bf16, compile) sends a seeded run down another trajectory, its
    tail another draw of that noise: dcgan seeded, whose baseline repeats agree exactly, read
    bf16's generator loss 3.138 against 2.902 (+8 %, beyond the 5 % floor) while its per-step
    losses swing by more than that. None with fewer than MIN_TAIL finite losses."""
    finite = tail[np.isfinite(tail)]
    if finite.size < MIN_TAIL:
        return None
    mean = abs(float(finite.mean()))
    return float(finite.std(ddof=1) / np.sqrt(finite.size) / mean) if mean > 0 else None


@dataclass(slots=True)
class OptimizerLosses:
    """What one trial recorded of each optimizer's own loss (empty for one optimizer)."""

    primary: str | None = None
    """The optimizer whose loss the step records' `loss` column holds (the trial's `loss`)."""
    end: dict[str, float | None] = field(default_factory=dict)
    """Optimizer name -> the mean of its loss over the last quarter of the step records."""
    start: dict[str, float | None] = field(default_factory=dict)
    """Optimizer name -> the mean of its first START_STEPS finite losses."""
    scatter: dict[str, float | None] = field(default_factory=dict)
    """Optimizer name -> its end loss's tail_scatter."""


def read_optimizer_losses(run: Any) -> OptimizerLosses:
    """Each optimizer's end and start loss in `run` (a RunData), in the order the run named them."""
    from trainspeed.telemetry.update_losses import EVENT, members, update_losses

    series = update_losses(run)
    if not series:
        return OptimizerLosses()
    events = [e.get("data") or {} for e in run.events_of(EVENT)]
    column = next((str(d["column"]) for d in events if d.get("column")), None)
    # the step records' optimizer, or the shared loss it is one of (named by all who share it)
    primary = next((name for name in series if column in members(name)), column)
    steps = [r.get("step") for r in run.steps]
    tail_from = len(steps) - max(1, len(steps) // 4)
    tail_steps = {s for s in steps[tail_from:] if isinstance(s, (int, float))}
    out = OptimizerLosses(primary=primary)
    for name, values in series.items():
        tail = values[tail_from:]
        finite = tail[np.isfinite(tail)]
        if any(_nonfinite_in(events, member, tail_steps) for member in members(name)):
            out.end[name] = math.inf  # recorded as null, counted apart: a NaN loss in the tail
        else:
            out.end[name] = float(finite.mean()) if finite.size else None
        out.scatter[name] = tail_scatter(tail)
        first = values[np.isfinite(values)][:START_STEPS]
        out.start[name] = float(first.mean()) if first.size else None
    return out


def _nonfinite_in(events: list[dict[str, Any]], name: str, steps: set[Any]) -> bool:
    """Whether an interval that holds one of `steps` counted a non-finite loss of `name` (the
    events count them per interval, not per step: an interval that reaches the tail counts)."""
    for data in events:
        first, losses = data.get("first_step"), (data.get("losses") or {}).get(name)
        if not (data.get("nonfinite") or {}).get(name) or not isinstance(first, int) or not isinstance(losses, list):
            continue
        if any(first + k in steps for k in range(len(losses))):
            return True
    return False


__all__ = ["MIN_TAIL", "START_STEPS", "OptimizerLosses", "read_optimizer_losses", "tail_scatter"]
