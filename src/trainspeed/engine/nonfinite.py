"""`nan_policy`: what a NaN/Inf loss does to a run.

- "skip": that step's update is dropped. Deciding needs the loss before optimizer.step(), so
  it is a deliberate host sync every step.
- "stop": the run raises NonFiniteLossError. Nothing runs per step: the Monitor reads the
  losses back at each logging interval (its one sync) and counts the non-finite ones, and
  the guard acts on that count, so the run stops within logging.every steps.
- "ignore": nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from trainspeed.engine.events import CallbackList, Event, TrainerState
from trainspeed.errors import TrainspeedError


class NonFiniteLossError(TrainspeedError):
    """The loss became NaN/Inf and nan_policy is "stop"."""


class NonFiniteGuard:
    def __init__(self, policy: str, log_every: int, callbacks: CallbackList, state: TrainerState) -> None:
        self.policy, self.log_every = policy, log_every
        self.callbacks, self.state = callbacks, state
        self.per_step = policy == "skip"  # the only policy with per-step work
        self.seen = 0  # the Monitor's count of NaN/Inf losses already acted on

    def should_skip(self, loss: torch.Tensor, mon: Any) -> bool:
        """nan_policy=skip: True (and an anomaly event) when this step's loss is NaN/Inf."""
        if bool(torch.isfinite(loss).item()):
            return False
        mon.event("anomaly", kind="nonfinite_loss", action="skipped", at_step=self.state.step + 1)
        self.callbacks.fire(Event.ANOMALY, self.state)
        return True

    def check(self, mon: Any) -> None:
        """nan_policy=stop: raise once the Monitor has read back a NaN/Inf loss. The Trainer
        calls this when `mon.nonfinite_losses != guard.seen` (an int comparison per step)."""
        count = mon.nonfinite_losses - self.seen
        self.seen = mon.nonfinite_losses
        if count and self.policy == "stop":
            mon.event("anomaly", kind="nonfinite_loss", action="stopped", count=count)
            self.callbacks.fire(Event.ANOMALY, self.state)
            raise NonFiniteLossError(
                f"the loss was NaN/Inf in {count} of the last {self.log_every} steps "
                f"(up to step {self.state.step}). Lower optim.lr, enable optim.grad_clip, use "
                "precision.mode=bf16-mixed instead of fp16, or set nan_policy=skip."
            )
