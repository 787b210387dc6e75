"""Phase timelines: charge the time between consecutive phase transitions to the phase that was
active in between (exclusive time; nested phases charge the innermost one).

Two clocks share one interface:

- `CpuTimeline` reads `time.perf_counter()` at each transition. Exact for CPU work.
- `CudaTimeline` records a `torch.cuda.Event` on the current stream at each transition and
  resolves the elapsed times later, in `resolve()`, so the training loop never waits for the
  GPU. It measures the GPU stream's timeline: the gap between "data begins" and "data ends"
  events is the time the GPU sat idle waiting for the loader, which is what matters.

The CPU timeline hands each step one small list of floats; the CUDA timeline draws events
from a pool that is refilled when steps are resolved.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from trainspeed.telemetry.schema import PHASES

N_PHASES = len(PHASES)
OTHER = PHASES.index("other")
# A step with more phase transitions than this (a script calling print() in a tight loop, say)
# charges the excess to the phase active at the cap; bounds memory per pending step.
MAX_TRANSITIONS = 256


class CpuTimeline:
    """Wall-clock phase accounting for CPU training (and for CPU-side waits).

    Plain Python floats in a list, not a numpy array: a transition runs twice per phase on
    the training thread, and a numpy scalar read-modify-write costs ~10x a list slot's."""

    def __init__(self) -> None:
        self._acc = [0.0] * N_PHASES
        self._active = OTHER
        self._last: float | None = None
        self._step_start: float | None = None

    @property
    def started(self) -> bool:
        return self._step_start is not None

    def start(self) -> None:
        now = time.perf_counter()
        self._last = self._step_start = now

    def transition(self, new_active: int) -> None:
        now = time.perf_counter()
        last = self._last
        if last is None:  # first activity starts the first step
            self._step_start = now
        else:
            self._acc[self._active] += now - last
        self._last = now
        self._active = new_active

    def end_step(self) -> tuple[float, list[float]]:
        """Close the current step; return (t_step, phase seconds). Starts the next step now."""
        now = time.perf_counter()
        if self._last is None:
            self._last = self._step_start = now
        acc = self._acc
        acc[self._active] += now - self._last
        t_step = now - self._step_start  # type: ignore[operator]
        self._acc = [0.0] * N_PHASES
        self._last = self._step_start = now
        return t_step, acc

    def resolve(self, pending: list[Any]) -> list[tuple[float, list[float]]]:
        return pending  # already resolved at end_step


class CudaTimeline:
    """GPU-stream phase accounting with lazily resolved CUDA events.

    `end_step()` returns a handle (the step's events and the phase active after each);
    `resolve(handles)` turns handles into (t_step, phases). Resolution synchronizes on the
    last event only: it is the one deliberate sync point, and the Monitor calls it at the
    log interval, never per step.
    """

    def __init__(self, device: Any, pool_size: int = 1024, event_factory: Any = None) -> None:
        if event_factory is None:
            import torch

            def event_factory() -> Any:
                return torch.cuda.Event(enable_timing=True)

        # The factory is injectable so the accounting is unit-tested on CPU with fake events.
        self._new_event = event_factory
        self._device = device
        self._pool: list[Any] = [event_factory() for _ in range(pool_size)]
        self._events: list[Any] = []
        self._phases: list[int] = []  # phase active in the interval that ends at events[i]
        self._active = OTHER
        self._boundary: Any = None  # event that opened the current step

    @property
    def started(self) -> bool:
        return self._boundary is not None

    def _record(self) -> Any:
        event = self._pool.pop() if self._pool else self._new_event()
        event.record()  # enqueued on the current stream: no host-device sync
        return event

    def start(self) -> None:
        self._boundary = self._record()

    def transition(self, new_active: int) -> None:
        if self._boundary is None:
            self._boundary = self._record()
        elif len(self._events) < MAX_TRANSITIONS:
            self._events.append(self._record())
            self._phases.append(self._active)
        self._active = new_active

    def end_step(self) -> tuple[Any, list[Any], list[int], Any]:
        if self._boundary is None:
            self._boundary = self._record()
        end = self._record()
        handle = (self._boundary, self._events, self._phases + [self._active], end)
        self._events, self._phases = [], []
        self._boundary = end  # the next step starts where this one ended (shared event)
        return handle

    def resolve(self, pending: list[Any]) -> list[tuple[float, np.ndarray]]:
        if not pending:
            return []
        # Deliberate sync point (once per log interval): wait for the newest event so that
        # every older one has completed too (events on one stream complete in order).
        pending[-1][3].synchronize()
        out: list[tuple[float, np.ndarray]] = []
        for start, events, phases, end in pending:
            acc = np.zeros(N_PHASES, dtype=np.float64)
            marks = [start, *events, end]
            # phases[i] was active between marks[i] and marks[i + 1].
            for i in range(len(marks) - 1):
                acc[phases[i]] += marks[i].elapsed_time(marks[i + 1]) / 1000.0
            out.append((float(start.elapsed_time(end)) / 1000.0, acc))
            self._pool.extend(events)
            self._pool.append(start)  # `end` stays alive as the next step's start
        return out
