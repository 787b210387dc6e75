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


_STEP_END = -1  # mark code: a step boundary (the active phase carries over)


class CpuTimeline:
    """Wall-clock phase accounting for CPU training (and for CPU-side waits).

    A transition appends one (perf_counter, new phase) pair and does nothing else; the
    per-phase sums are made in `resolve()`, at the log interval. Measured in a training loop,
    Python code that runs right after a torch op runs with cold caches and costs ~10x its
    tight-loop time, so the hot path is kept to the fewest calls and objects possible.
    """

    def __init__(self) -> None:
        self.marks: list[tuple[float, int]] = []
        self._active = OTHER  # phase active after the last resolved mark
        self._last: float | None = None  # time of the last resolved mark
        self._step_start: float | None = None
        self._since_step = 0  # transitions recorded in the current step (capped)

    @property
    def started(self) -> bool:
        return self._step_start is not None or bool(self.marks)

    def start(self) -> None:
        self.marks.append((time.perf_counter(), OTHER))

    def transition(self, new_active: int) -> None:
        if self._since_step >= MAX_TRANSITIONS:
            return  # the rest of this step is charged to the phase active at the cap
        self._since_step += 1
        self.marks.append((time.perf_counter(), new_active))

    def end_step(self) -> None:
        """Close the current step at now; resolve() returns its (t_step, phase seconds)."""
        self._since_step = 0
        self.marks.append((time.perf_counter(), _STEP_END))

    def resolve(self, pending: list[Any]) -> list[tuple[float, list[float]]]:
        """(t_step, per-phase seconds) for every step closed since the last call. Marks after
        the last step end belong to the step in progress and stay for the next call."""
        marks = self.marks
        end = len(marks)
        while end and marks[end - 1][1] != _STEP_END:
            end -= 1
        if not end:
            return []
        done, self.marks = marks[:end], marks[end:]
        out: list[tuple[float, list[float]]] = []
        active, last, start = self._active, self._last, self._step_start
        acc = [0.0] * N_PHASES
        for t, code in done:
            if last is None:  # the first activity starts the first step
                last = start = t
            acc[active] += t - last
            last = t
            if code == _STEP_END:
                out.append((t - start, acc))  # type: ignore[operator]
                acc = [0.0] * N_PHASES
                start = t
            else:
                active = code
        self._active, self._last, self._step_start = active, last, start
        return out


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
