"""The doctor's defaults that its command line and the commands it prints share."""

from __future__ import annotations

DEFAULT_STEPS = 200
"""`trainspeed doctor`'s run length when --steps is not given (a command that carries the run's own
length leaves it out at this value)."""

__all__ = ["DEFAULT_STEPS"]
