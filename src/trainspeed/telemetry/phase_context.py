"""The context objects `Monitor.phase(name)` returns: `with mon.phase("forward"):`.

One object per phase name lives as long as its Monitor, so a loop may fetch it once and keep
it. They run on the hot path, around every torch op of a step, so each does the least it can:
on the CPU timeline one (perf_counter, code) append per transition (MarkPhase), otherwise a
call to Monitor.begin/end (Phase).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from trainspeed.telemetry.schema import MEASURED_PHASES, PHASES
from trainspeed.telemetry.timeline import end_code

__all__ = ["PHASE_INDEX", "Phase", "PhaseHost", "MarkPhase", "PhaseTable", "phase_codes", "unknown_phase"]

PHASE_INDEX = {name: i for i, name in enumerate(PHASES)}
_perf_counter = time.perf_counter


class PhaseHost(Protocol):
    """What a phase's context object uses of its Monitor (which satisfies this without
    naming it, so this module never imports monitor, which imports it)."""

    _timeline: Any  # CpuTimeline or CudaTimeline; MarkPhase appends to the CPU one's marks

    def begin(self, name: str) -> None: ...

    def end(self, name: str) -> None: ...


def unknown_phase(name: str) -> Exception:
    """The error for a phase name that is not a measured phase (Monitor.begin, mon.phase)."""
    from trainspeed.errors import ConfigError

    return ConfigError(f"unknown phase {name!r}; phases are {', '.join(MEASURED_PHASES)}")


def phase_codes(name: str) -> tuple[int, int]:
    """The (enter, leave) codes of a measured phase, for `Monitor.mark((time, code))`."""
    idx = PHASE_INDEX[name]
    if name not in MEASURED_PHASES:
        raise ValueError(f"{name!r} is not a measured phase; phases are {', '.join(MEASURED_PHASES)}")
    return idx, end_code(idx)


class Phase:
    """Context object for `mon.phase(name)` through Monitor.begin/end (CUDA timelines, or
    while a profiler window shadows begin/end)."""

    __slots__ = ("_mon", "_name")

    def __init__(self, mon: PhaseHost, name: str) -> None:
        self._mon, self._name = mon, name

    def __enter__(self) -> None:
        self._mon.begin(self._name)

    def __exit__(self, *exc: Any) -> None:
        self._mon.end(self._name)


class MarkPhase:
    """Context object for `mon.phase(name)` on the CPU timeline: entering and leaving append
    one (time, code) mark each, nothing else (see CpuTimeline). ~10 of these run every step,
    each right after a torch op, where Python code runs with cold caches: no check either. While
    a profiler window shadows begin/end, Monitor.hook_phases turns each into a HookedMarkPhase
    (its class swapped in place), so a loop may hold on to these objects across the window."""

    __slots__ = ("_mon", "_name", "_append", "_idx", "_end")

    def __init__(self, mon: PhaseHost, name: str) -> None:
        idx = PHASE_INDEX[name]
        self._mon, self._name = mon, name
        self._append, self._idx, self._end = mon._timeline.marks.append, idx, end_code(idx)

    def __enter__(self) -> None:
        self._append((_perf_counter(), self._idx))

    def __exit__(self, *exc: Any) -> None:
        self._append((_perf_counter(), self._end))


class HookedMarkPhase(MarkPhase):
    """A MarkPhase while a profiler window is open: transitions go through Monitor.begin/end."""

    __slots__ = ()

    def __enter__(self) -> None:
        self._mon.begin(self._name)

    def __exit__(self, *exc: Any) -> None:
        self._mon.end(self._name)


class PhaseTable(dict):
    """Every phase's context object, by name, built once per Monitor. `Monitor.phase` is this
    table's `__getitem__`: a lookup in C, where a Python method would add a frame to each of
    the ~3 `with mon.phase(...)` of every step. A name that is not a phase raises ConfigError
    naming the valid ones."""

    def __missing__(self, name: str) -> Any:
        raise unknown_phase(name)
