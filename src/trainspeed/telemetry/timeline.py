"""Phase timelines: charge the time between consecutive phase transitions to the phase that was
active in between (exclusive time; nested phases charge the innermost one).

Two clocks share one interface:

- `CpuTimeline` reads `time.perf_counter()` at each transition. Exact for CPU work.
- `CudaTimeline` records a `torch.cuda.Event` on the current stream at each transition and
  resolves the elapsed times later, in `resolve()`, so the training loop never waits for the
  GPU. It measures the GPU stream's timeline: the gap between "data begins" and "data ends"
  events is the time the GPU sat idle waiting for the loader, which is what matters.

Both keep the steps closed since the last `resolve()` themselves (the CPU timeline as marks,
the CUDA one as event handles), so closing a step is one call; the CUDA timeline draws events
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
# charges the excess to the phase active at the cap; bounds memory per pending step. An RL
# episode per step is 2-4 transitions per environment step (its forward, the state's tensor):
# reinforce.py's 200-step episodes took 800; 256 charged half of each to "other".
MAX_TRANSITIONS = 2048
FEW_PER_PHASE = 4
"""Past the cap a phase's first few begins in the step are still recorded: the repeated phase
(the forwards, the prints) is what the cap drops, not the step's one backward and update
(reinforce.py past 256: backward and optimizer read 0, their time "other")."""


# Mark codes: a phase index (>= 0) opens that phase, end_code(idx) closes it, STEP_END closes
# a step (the active phase carries over into the next one).
STEP_END = -1


def end_code(idx: int) -> int:
    return -2 - idx


class CpuTimeline:
    """Wall-clock phase accounting for CPU training (and for CPU-side waits).

    Entering or leaving a phase appends one (perf_counter, code) pair and does nothing else:
    the nesting stack and the per-phase sums are replayed in `resolve()`, at the log interval.
    Python code that runs right after a torch op runs with cold caches (an empty call costs
    ~1.5 µs there against 0.1 µs in a tight loop), so the hot path is one append.
    `Monitor.phase` contexts append to `marks` directly; `begin`/`end` are the checked path
    for hooks (the doctor, integrations), capped at MAX_TRANSITIONS per step.
    """

    def __init__(self) -> None:
        self.marks: list[tuple[float, int]] = []  # never rebound: phase contexts hold .append
        self._stack: list[int] = []  # open phases after the last resolved mark
        self._last: float | None = None  # time of the last resolved mark
        self._step_start: float | None = None
        self._since_step = 0  # begin/end marks recorded in the current step
        self._suppressed: list[int] = []  # phases opened past the cap: their ends are dropped too
        self._begins = [0] * N_PHASES  # begins per phase in the current step (reset at its first)

    def begin(self, idx: int) -> None:
        if not self._since_step:  # the step's first mark (Monitor.step resets the count itself)
            self._begins = [0] * N_PHASES
        if self._since_step >= MAX_TRANSITIONS and self._begins[idx] >= FEW_PER_PHASE:
            # a script printing in a tight loop: the rest of the step is charged to the phase
            # open at the cap; begin/end pairs are dropped together so the nesting stays right
            self._suppressed.append(idx)
            return
        self._begins[idx] += 1
        self._since_step += 1
        self.marks.append((time.perf_counter(), idx))

    def end(self, idx: int) -> None:
        if self._suppressed and self._suppressed[-1] == idx:
            self._suppressed.pop()
            return
        self._since_step += 1
        self.marks.append((time.perf_counter(), end_code(idx)))

    def end_step(self) -> float:
        """Close the current step at now (returned, perf_counter seconds); resolve() returns
        its (t_step, phase seconds)."""
        self._since_step = 0
        t = time.perf_counter()
        self.marks.append((t, STEP_END))
        return t

    def resolve(self) -> list[tuple[float, list[float]]]:
        """(t_step, per-phase seconds) for every step closed since the last call; time goes to
        the innermost open phase. Marks after the last step end belong to the step in progress
        and stay for the next call."""
        return self.resolve_marks(self.take_closed())

    def take_closed(self) -> list[tuple[float, int]]:
        """The marks of the steps closed since the last call, taken out of `marks` (those of the
        step in progress stay). Cheap: the training thread takes them at the log interval and
        the writer thread resolves them (resolve_marks), in the order they were taken."""
        marks = self.marks
        end = len(marks)
        while end and marks[end - 1][1] != STEP_END:
            end -= 1
        if not end:
            return []
        done = marks[:end]
        del marks[:end]  # in place: phase contexts hold marks.append
        return done

    def resolve_marks(self, done: list[tuple[float, int]]) -> list[tuple[float, list[float]]]:
        """(t_step, per-phase seconds) of each step in `done` (take_closed's), carrying the open
        phases and the last mark over to the next call: calls must come in the order taken."""
        if not done:
            return []
        out: list[tuple[float, list[float]]] = []
        stack, last, start = self._stack, self._last, self._step_start
        acc = [0.0] * N_PHASES
        for t, code in done:
            if last is None:  # the first activity starts the first step
                last = start = t
            acc[stack[-1] if stack else OTHER] += t - last
            last = t
            if code >= 0:
                stack.append(code)
            elif code == STEP_END:
                out.append((t - start, acc))  # type: ignore[operator]
                acc = [0.0] * N_PHASES
                start = t
            else:
                idx = -2 - code
                if idx in stack:  # unbalanced hooks (an exception in between): unwind to it
                    while stack.pop() != idx:
                        pass
        self._last, self._step_start = last, start
        return out


class CudaTimeline:
    """GPU-stream phase accounting with lazily resolved CUDA events.

    `end_step()` keeps a handle (the step's events and the phase active after each);
    `resolve()` turns the handles kept so far into (t_step, phases). Resolution synchronizes
    on the last event only: it is the one deliberate sync point, and the Monitor calls it at the
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
        self._stack: list[int] = []  # open phases, innermost last
        self._boundary: Any = None  # event that opened the current step
        self._closed: list[Any] = []  # handles of the steps closed since the last resolve()

    def _record(self) -> Any:
        event = self._pool.pop() if self._pool else self._new_event()
        event.record()  # enqueued on the current stream: no host-device sync
        return event

    def begin(self, idx: int) -> None:
        self._stack.append(idx)
        self.transition(idx)

    def end(self, idx: int) -> None:
        stack = self._stack
        if idx in stack:  # unbalanced hooks (an exception in between): unwind to it
            while stack.pop() != idx:
                pass
        self.transition(stack[-1] if stack else OTHER)

    def transition(self, new_active: int) -> None:
        if self._boundary is None:
            self._boundary = self._record()
        elif len(self._events) < MAX_TRANSITIONS:
            self._events.append(self._record())
            self._phases.append(self._active)
        self._active = new_active

    def end_step(self) -> float:
        """Close the current step; returns the host's perf_counter at the call (the GPU's end
        of the step comes later, through resolve())."""
        if self._boundary is None:
            self._boundary = self._record()
        end = self._record()
        self._closed.append((self._boundary, self._events, self._phases + [self._active], end))
        self._events, self._phases = [], []
        self._boundary = end  # the next step starts where this one ended (shared event)
        return time.perf_counter()

    def resolve(self) -> list[tuple[float, np.ndarray]]:
        pending = self._closed
        if not pending:
            return []
        self._closed = []
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
