"""The doctor's defaults that its command line and the commands it prints share."""

from __future__ import annotations

DEFAULT_STEPS = 200
"""`trainspeed doctor`'s run length when --steps is not given (a command that carries the run's own
length leaves it out at this value)."""
MEASURED_AT_LEAST = 3
"""Measured steps a script that ended inside a warm-up is told to add (the doctor's and a tune
trial's): enough for a median step time."""


def default_warmup(steps: int | None) -> int:
    """Warm-up steps without --warmup-steps: a tenth of the run, 1 to 5 (a run to the script's
    end, steps None, as one of 50)."""
    return max(1, min(5, (steps or 50) // 10))


__all__ = ["DEFAULT_STEPS", "MEASURED_AT_LEAST", "default_warmup"]
