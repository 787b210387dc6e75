"""A line on the terminal while a long doctor run goes on.

A newcomer's `trainspeed doctor -- python main.py --epochs 1` (word_language_model, 200 steps)
took 7.5 minutes with nothing on the screen but the script's "Using device: cpu". The doctor now
says how far it is, every minute or so, on stderr and only on a terminal: a tune's trials, CI
logs and pipes get none of it, and the script's own output stays as it was.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

FIRST_S = 30.0
"""A run shorter than this prints nothing."""
EVERY_S = 60.0


class DoctorProgress:
    """Called with the steps done after each step; prints at most every EVERY_S seconds."""

    def __init__(self, max_steps: int | None, stream: TextIO, clock: Callable[[], float] = time.perf_counter) -> None:
        self.max_steps, self.stream, self.clock = max_steps, stream, clock
        self.t_first: float | None = None  # the first step's end: setup and imports are not steps
        self.next_at = clock() + FIRST_S

    def __call__(self, steps: int) -> None:
        now = self.clock()
        if self.t_first is None:
            self.t_first = now
        if now < self.next_at:
            return
        self.next_at = now + EVERY_S
        per = (now - self.t_first) / (steps - 1) if steps > 1 else None
        text = f"trainspeed doctor: step {steps}" + (f" of {self.max_steps}" if self.max_steps else "")
        if per is not None:
            text += f", {per:.2f} s a step" if per < 10 else f", {per:.0f} s a step"
            if self.max_steps:
                text += f", ~{_duration(per * max(0, self.max_steps - steps))} to go"
        print(text, file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def progress_for(max_steps: int | None, stream: TextIO | None = None) -> DoctorProgress | None:
    """A progress printer for an interactive terminal (stderr), else None."""
    stream = stream or sys.stderr
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        interactive = False
    return DoctorProgress(max_steps, stream) if interactive else None


__all__ = ["DoctorProgress", "progress_for"]
