"""Learning-rate schedules: linear warm-up, then constant, cosine or linear decay.

`lr_factor` is the pure math (a multiplier of the peak lr, unit-tested on numbers);
`build_scheduler` wraps it in a `LambdaLR`, which the loop steps once per optimizer step.

Conventions (step = optimizer steps already taken, 0-based):
- warm-up: factor (step + 1) / warmup for step < warmup, so the first update already moves
  (lr / warmup) and step warmup - 1 runs at the peak lr;
- decay: progress p = (step - warmup) / (total - warmup - 1), clamped to [0, 1], so the first
  step after warm-up runs at the peak lr and the last step (total - 1) at min_ratio * lr;
  cosine: min + (1 - min) * (1 + cos(pi p)) / 2; linear: min + (1 - min) * (1 - p).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch

from trainspeed.errors import ConfigError, TrainspeedError

__all__ = ["lr_factor", "build_scheduler", "build_loop_scheduler", "steps_per_epoch", "loop_length", "SCHEDULES"]

SCHEDULES = ("constant", "cosine", "linear")
Kind = Literal["constant", "cosine", "linear"]


def lr_factor(step: int, warmup: int, total: int | None, kind: Kind, min_ratio: float = 0.0) -> float:
    """Multiplier of the peak learning rate at optimizer step `step` (0-based)."""
    if kind not in SCHEDULES:
        raise ConfigError(f"optim.schedule must be one of {', '.join(SCHEDULES)}, got {kind!r}")
    if warmup < 0:
        raise ConfigError(f"optim.warmup_steps must be >= 0, got {warmup}")
    if not 0.0 <= min_ratio <= 1.0:
        raise ConfigError(f"optim.min_lr_ratio must be in [0, 1], got {min_ratio}")
    if step < 0:
        raise ConfigError(f"lr_factor: step must be >= 0, got {step}")
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    if total is None or total < 1:
        raise ConfigError(
            f"optim.schedule={kind!r} decays over the run and needs the total number of steps, "
            f"got {total!r}; set run.max_steps, or use optim.schedule=constant"
        )
    span = total - warmup - 1
    progress = 1.0 if span <= 0 else min(1.0, (step - warmup) / span)
    if kind == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        shape = 1.0 - progress
    return min_ratio + (1.0 - min_ratio) * shape


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Any,
                    total_steps: int | None) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over `lr_factor` from `cfg.schedule`, `cfg.warmup_steps`, `cfg.min_lr_ratio`.

    Call `scheduler.step()` once per optimizer step (not per micro-batch). The schedule is
    checked here, at setup, so a decaying schedule without a known length fails before training.
    """
    kind = getattr(cfg, "schedule", "constant")
    warmup = int(getattr(cfg, "warmup_steps", 0))
    min_ratio = float(getattr(cfg, "min_lr_ratio", 0.0))
    # Validate eagerly (raises ConfigError): at the last step every rule is exercised.
    lr_factor(max(warmup, (total_steps or 1) - 1), warmup, total_steps, kind, min_ratio)

    def factor(step: int) -> float:
        return lr_factor(step, warmup, total_steps, kind, min_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def build_loop_scheduler(optimizer: torch.optim.Optimizer, cfg: Any,
                         total_steps: int | None) -> tuple[torch.optim.lr_scheduler.LambdaLR, bool]:
    """`build_scheduler` for a training loop, and whether the loop may skip `scheduler.step()`.

    A constant lr without warm-up never changes, so stepping LambdaLR is pure cost (~15 µs a
    step in a loop; the caller records the step count in checkpoints instead). Such a scheduler
    is never stepped, so the wrapper LRScheduler puts on `optimizer.step` (to warn when
    scheduler.step() comes first) is removed too: it costs Python calls every step. Only a
    wrapper this scheduler added is removed; one a user's own scheduler put there stays.
    """
    wrapped_before = bool(getattr(optimizer.__dict__.get("step"), "_wrapped_by_lr_sched", False))
    scheduler = build_scheduler(optimizer, cfg, total_steps)
    static = getattr(cfg, "schedule", "constant") == "constant" and int(getattr(cfg, "warmup_steps", 0)) == 0
    if static and not wrapped_before:
        optimizer.__dict__.pop("step", None)
    return scheduler, static


def steps_per_epoch(loader: Any, accumulation_steps: int = 1) -> int | None:
    """Optimizer steps in one epoch of `loader` (None: the loader has no length)."""
    try:
        return -(-len(loader) // accumulation_steps)
    except TypeError:
        return None


def loop_length(loader: Any, run: Any, accumulation_steps: int = 1) -> int:
    """Optimizer steps the loop runs: run.max_steps, else run.max_epochs (default 1) epochs."""
    if run.max_steps:
        return run.max_steps
    per_epoch = steps_per_epoch(loader, accumulation_steps)
    if per_epoch is None:
        raise TrainspeedError("run.max_steps is not set and the training data has no length (an "
                              "IterableDataset?), so the number of steps is unknown. Set run.max_steps.")
    return per_epoch * (run.max_epochs or 1)
