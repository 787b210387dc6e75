"""Each optimizer's own loss, for scripts that step several (a GAN's optimizerD and optimizerG).

A step's loss was every loss backwarded since the previous step, averaged: on dcgan, whose
optimizerD closes the steps, the mean of the last iteration's errG and this one's errD_real and
errD_fake, a number neither network's training follows. With several optimizers, a backward's
loss belongs to the optimizer that steps next (the update that applies its gradients); one
that steps with no backward of its own since the previous update (two optimizers over one
model's parameter groups, one backward) shares that update's loss.

An update's loss: one backward's loss; the sum of its backwards when they are terms of one
batch (dcgan's errD_real + errD_fake: the errD it prints) or were scaled (`loss / accum`); over
k micro-batches of unscaled losses, the sum / k (the mean per micro-batch, as with one
optimizer); a closure optimizer's first evaluation.

Rows: the primary optimizer's update closes step k and is row k; another optimizer's update
is the last closed step's row (the same iteration, as the script prints D's and G's losses on
one line); several updates of one optimizer in one row are averaged (a WGAN's critic). The
values stay where they are (a copy into a device buffer: no host sync) and are read, once per
log interval, right after the Monitor's own read of the step losses, into "update_losses"
events (format: telemetry/update_losses.py). Bounded: MAX_OPTIMIZERS buffers of one interval.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from trainspeed.doctor.instrument.updates import assigned_name
from trainspeed.telemetry.update_losses import EVENT

MAX_OPTIMIZERS = 16
MONITOR_MAX_PENDING = 1000
"""The Monitor reads its pending steps back at least this often, whatever log_every is
(monitor._MAX_PENDING): the rows here are read at the same steps."""


def update_loss(loss_sum: Any, losses: int, scaled: int, loss_first: Any, micro: int | None) -> Any:
    """One update's loss from the backwards since the previous update (module docstring)."""
    if losses == 0:
        return loss_first
    if losses == 1 or scaled == losses:
        return loss_sum
    per = max(1, min(losses, micro or 1))
    return loss_sum if per == 1 else loss_sum / per


class _Rows:
    """One optimizer's loss per row of the interval, in `slots` ring slots: CPU scalars as
    floats (read at once, as the Monitor reads them), others summed in a device buffer."""

    __slots__ = ("host", "count", "device", "on_device")

    def __init__(self, slots: int) -> None:
        self.host = [0.0] * slots
        self.count = [0] * slots
        self.device: torch.Tensor | None = None
        self.on_device = [False] * slots

    def add(self, slot: int, loss: torch.Tensor) -> None:
        self.count[slot] += 1
        if loss.is_cpu:
            self.host[slot] += loss.item()  # a CPU scalar: nothing to wait for
            return
        value = loss.detach().reshape(()).float()
        if self.device is None or self.device.device != value.device:
            self.device = torch.zeros(len(self.count), dtype=torch.float32, device=value.device)
            self.on_device = [False] * len(self.count)
        if self.on_device[slot]:
            self.device[slot].add_(value)  # async: no host sync
        else:
            self.device[slot].copy_(value)
            self.on_device[slot] = True

    def take(self, slots: list[int]) -> tuple[list[float | None], int]:
        """The rows' mean losses (None: no update, or not finite) and the non-finite count;
        the slots are emptied."""
        # Deliberate sync point, once per log interval (CUDA): read the buffer back
        device = self.device.tolist() if self.device is not None and any(self.on_device) else None
        values: list[float | None] = []
        nonfinite = 0
        for slot in slots:
            n = self.count[slot]
            total = self.host[slot] + (device[slot] if device is not None and self.on_device[slot] else 0.0)
            value = total / n if n else None
            if value is not None and not math.isfinite(value):
                nonfinite += 1
                value = None
            values.append(value)
            self.host[slot], self.count[slot], self.on_device[slot] = 0.0, 0, False
        return values, nonfinite


class UpdateLosses:
    """The per-optimizer loss rows of one doctor run. See module docstring."""

    def __init__(self, monitor: Any, observations: dict[str, dict[str, Any]]) -> None:
        self.monitor = monitor
        self.observations = observations  # the session's: each optimizer's construction site
        self.period = 0  # the Monitor's interval, read at the first update (most runs have none)
        self.slots = 0  # one interval's rows, and the newest row, which a later optimizer may still add to
        self.rows: dict[int, _Rows] = {}  # id(optimizer) -> its rows, in first-update order
        self.names: dict[int, str] = {}
        self.base = 0  # the first row not yet written
        self.last_row = -1
        self.column: int | None = None  # the optimizer whose loss the step records hold

    def add(self, opt: Any, row: int, loss: Any, *, primary: bool) -> None:
        """`opt`'s update in step row `row` (0-based) had this loss (a tensor, or None)."""
        if primary:
            self.column = id(opt)
        if not self.period:
            self.period = max(1, min(int(self.monitor.log_every), MONITOR_MAX_PENDING))
            self.slots = self.period + 1
        rows = self.rows.get(id(opt))
        if rows is None:
            if len(self.rows) >= MAX_OPTIMIZERS:
                return
            rows = self.rows[id(opt)] = _Rows(self.slots)
        if row < self.base or not isinstance(loss, torch.Tensor):
            return
        if self.last_row < 0:
            self.base = row  # the first loss: the steps before it (one optimizer then) have none here
        elif row >= self.base + self.slots:
            self.write(row - self.period)  # never two rows in one ring slot
        rows.add(row % self.slots, loss)
        self.last_row = max(self.last_row, row)

    def after_step(self, steps_done: int) -> None:
        """A step closed: at the Monitor's interval, write the rows before the newest (another
        optimizer may still add to it)."""
        if self.period and steps_done % self.period == 0:
            self.write(steps_done - 1)

    def write(self, end: int) -> None:
        """Write rows base..end-1 as one event."""
        if end <= self.base or not self.rows:
            return
        slots = [row % self.slots for row in range(self.base, end)]
        losses: dict[str, list[float | None]] = {}
        nonfinite: dict[str, int] = {}
        for key, rows in self.rows.items():
            name = self._name(key)
            losses[name], bad = rows.take(slots)
            if bad:
                nonfinite[name] = bad
        if losses:
            self.monitor.event(EVENT, first_step=self.base + 1, losses=losses, nonfinite=nonfinite,
                               column=self._name(self.column) if self.column is not None else None)
        self.base = end

    def finish(self) -> None:
        """The run is over: write every row left."""
        try:
            self.write(self.last_row + 1)
        except RuntimeError:  # the device failed (the script's CUDA error): these rows are lost, not the report
            pass

    def _name(self, key: int) -> str:
        """The variable the script assigns the optimizer to (`optimizerD`), else its class; a
        name already taken gets `#2`, `#3` (layer-wise training builds each layer's `self.opt`)."""
        name = self.names.get(key)
        if name is None:
            obs = self.observations.get(f"optimizer:{key}") or {}
            site = obs.get("site_path")
            base = assigned_name(tuple(site)) if site else None
            base = base or str(obs.get("class") or "optimizer")
            taken = set(self.names.values())
            name, k = base, 1
            while name in taken:
                k += 1
                name = f"{base}#{k}"
            self.names[key] = name
        return name


__all__ = ["MAX_OPTIMIZERS", "UpdateLosses", "update_loss"]
