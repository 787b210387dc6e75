"""`trainspeed.step()`: mark the end of a training step in a loop the doctor cannot read.

The doctor finds a step on its own in loops that use a torch.optim optimizer (its step hook)
and in loops that update parameters by hand (a training forward after a backward). A loop it
cannot read (several models trained in turns without an optimizer, an engine that hides its
backward) gets one line at the end of each step:

    import trainspeed
    ...
    trainspeed.step()

Outside the doctor this is a no-op (one global read), so the line can stay in the script.
This module imports nothing: the doctor registers its handler here while it runs.
"""

from __future__ import annotations

from typing import Callable

_handler: Callable[[], None] | None = None


def step() -> None:
    """Close the current training step (inside `trainspeed doctor`); a no-op otherwise."""
    handler = _handler
    if handler is not None:
        handler()


def set_step_handler(handler: Callable[[], None] | None) -> Callable[[], None] | None:
    """Install the function `step()` calls (None: back to a no-op); returns the previous one."""
    global _handler
    previous, _handler = _handler, handler
    return previous
