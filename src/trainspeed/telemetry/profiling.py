"""Profiler windows: a `torch.profiler` trace of a few chosen steps, named after our phases.

    mon = Monitor(run_dir, profile_steps="50-55")   # or ProfileWindow(...).attach(mon)

Steps are the Monitor's step numbers (the `step` field of steps.jsonl, counted from 1). The
window opens when step START begins (right after step START-1 was closed, so START's data
wait is inside) and closes when step END is closed; the Chrome/Perfetto trace is then
exported, uncompressed, to `<run_dir>/profile_steps_START-END.json` and a `profile` event
records its name. Inside the window every Monitor phase is also a
`torch.profiler.record_function("trainspeed.<phase>")` range and every step a
`trainspeed.step#N` range, so the trace shows our phases above the operators and kernels.

Zero cost outside the window: the phase hooks are installed on the Monitor instance
(`mon.begin` / `mon.end` shadow the class methods) only while the window is open, and
removed when it closes. The profiled steps, and the step that pays for the export, are
marked warm-up so the profiler's own overhead never enters throughput figures.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from trainspeed.errors import ConfigError

TRACE_PREFIX = "profile_steps_"
RANGE_PREFIX = "trainspeed."


def parse_steps(steps: str | tuple[int, int] | list[int]) -> tuple[int, int]:
    """'50-55' (or (50, 55)) -> (50, 55), inclusive; ConfigError for anything else."""
    if isinstance(steps, (tuple, list)) and len(steps) == 2 and all(
        isinstance(s, int) and not isinstance(s, bool) for s in steps
    ):
        start, end = int(steps[0]), int(steps[1])
    else:
        m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", steps) if isinstance(steps, str) else None
        if m is None:
            raise ConfigError(
                f"profile.steps must be a step range 'START-END' such as '50-55', got {steps!r}"
            )
        start, end = int(m.group(1)), int(m.group(2))
    if start < 1 or start > end:
        raise ConfigError(
            f"profile.steps must be 'START-END' with 1 <= START <= END (steps count from 1), "
            f"got {start}-{end}; e.g. '50-55'"
        )
    return start, end


def trace_name(start: int, end: int) -> str:
    return f"{TRACE_PREFIX}{start}-{end}.json"


class ProfileWindow:
    """Profile steps START..END (inclusive) of one Monitor. See module docstring."""

    def __init__(
        self,
        run_dir: str | Path,
        steps: str | tuple[int, int],
        *,
        device: Any = None,
        record_shapes: bool = True,
        with_stack: bool = False,
        profile_memory: bool = False,
    ) -> None:
        self.start, self.end = parse_steps(steps)
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / trace_name(self.start, self.end)
        self.device = device
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.profile_memory = profile_memory
        self.done = False
        self.first_step: int | None = None  # first step actually captured
        self._mon: Any = None
        self._prof: Any = None
        self._ranges: list[tuple[str, Any]] = []  # open record_function ranges (phase, range)
        self._step_range: Any = None

    @property
    def is_open(self) -> bool:
        return self._prof is not None

    # ------------------------------------------------------------ Monitor side
    def attach(self, monitor: Any) -> "ProfileWindow":
        """Follow `monitor`: it calls `after_step` after each step and `finish` at close."""
        self._mon = monitor
        self.after_step(monitor.steps_done)
        return self

    def after_step(self, steps_done: int) -> None:
        """Called by the Monitor after step `steps_done` was closed; opens/closes the window."""
        if self.done:
            return
        if self._prof is not None:
            if steps_done >= self.end:
                self._close(steps_done)
                self._mon.mark_warmup()  # the next step pays for the export
            else:
                self._next_step_range(steps_done + 1)
                self._mon.mark_warmup()
            return
        if self.start <= steps_done + 1 <= self.end:
            self._open(steps_done + 1)
            self._mon.mark_warmup()

    def finish(self) -> None:
        """The run ended (or crashed) inside the window: export the steps captured so far."""
        if self._prof is not None:
            self._close(self._mon.steps_done if self._mon is not None else self.end)
        self.done = True

    # ------------------------------------------------------------ profiler
    def _activities(self) -> list[Any]:
        import torch
        from torch.profiler import ProfilerActivity

        acts = [ProfilerActivity.CPU]
        if self.device is not None and str(self.device).startswith("cuda") and torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        return acts

    def _open(self, step: int) -> None:
        import torch.profiler

        self._prof = torch.profiler.profile(
            activities=self._activities(),
            record_shapes=self.record_shapes,
            with_stack=self.with_stack,
            profile_memory=self.profile_memory,
        )
        self._prof.start()
        self.first_step = step
        self._next_step_range(step)
        mon = self._mon
        # Shadow the class methods on this instance only while the window is open: the
        # Monitor's hot path pays nothing outside it.
        if mon is not None:
            mon.begin = self._begin
            mon.end = self._end
            mon.hook_phases(True)  # `with mon.phase(...)` and mon.mark then go through them too

    def _close(self, last_step: int) -> None:
        mon = self._mon
        if mon is not None:
            mon.__dict__.pop("begin", None)
            mon.__dict__.pop("end", None)
            mon.hook_phases(False)
        while self._ranges:
            self._ranges.pop()[1].__exit__(None, None, None)
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        prof, self._prof = self._prof, None
        prof.stop()
        self.done = True
        t0 = time.perf_counter()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        error = None
        try:
            prof.export_chrome_trace(str(self.path))
        except Exception as exc:  # noqa: BLE001 - a failed export must not end the training run
            error = f"{type(exc).__name__}: {exc}"
        if mon is not None:
            captured = [self.first_step, max(last_step, self.first_step or 0)]
            if error is None:
                mon.event("profile", path=self.path.name, steps=[self.start, self.end],
                          captured=captured, export_s=round(time.perf_counter() - t0, 3))
            else:
                mon.event("warning", message=f"profiler trace export failed: {error}")

    def _next_step_range(self, step: int) -> None:
        import torch.profiler

        if self._step_range is not None:
            # Phases still open at a step boundary end with their step.
            while self._ranges:
                self._ranges.pop()[1].__exit__(None, None, None)
            self._step_range.__exit__(None, None, None)
        self._step_range = torch.profiler.record_function(f"{RANGE_PREFIX}step#{step}")
        self._step_range.__enter__()

    # ------------------------------------------------------------ phase hooks
    def _begin(self, name: str) -> None:
        import torch.profiler

        type(self._mon).begin(self._mon, name)  # validates the name first
        rf = torch.profiler.record_function(RANGE_PREFIX + name)
        rf.__enter__()
        self._ranges.append((name, rf))

    def _end(self, name: str) -> None:
        type(self._mon).end(self._mon, name)
        if any(n == name for n, _ in self._ranges):  # ranges opened before the window are not ours
            while self._ranges:
                n, rf = self._ranges.pop()
                rf.__exit__(None, None, None)
                if n == name:
                    break
