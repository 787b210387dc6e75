"""Loading torch faster in trainspeed's own processes: the cyclic garbage collector paused
while the modules every training process imports are loaded, and in the engine's own
processes those modules' objects frozen out of its reach afterwards.

`import torch`, and `torch._dynamo`, which the first `torch.optim` optimizer imports (its
`__init__` is wrapped in `torch._disable_dynamo`), create objects by the hundred thousand.
CPython's collector runs a generation-2 pass each time the long-lived heap has grown by a
quarter, rescanning everything already imported; imports leave next to no reference cycles.
- Paused while they run, the collector still scans the new objects once per generation when it
  resumes: a small saving. This is all that is done where a user's script runs (the doctor,
  `trainspeed run`, tune's fork server): its later collections must cost what they cost
  without trainspeed (a `gc.collect()` in its loop is a finding the doctor measures).
- `gc.freeze()` before it resumes moves them to the permanent generation, never scanned again:
  `import torch, torch._dynamo` took 2.2-2.9 s of CPU instead of 3.1-4.4 s on the 2-core EPYC
  VM (6 runs each, interleaved). Only `trainspeed train` does this, a process that is ours
  from start to end; its training loop's full collections get cheaper too.
The collector's state is restored after the imports (a process that had it off keeps it off).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
from typing import Iterator

__all__ = ["TRAINING_MODULES", "gc_paused", "preload"]

TRAINING_MODULES = ("torch", "torch.optim", "torch._dynamo")
"""What every process that trains imports before its first step (torch._dynamo: the first
optimizer's __init__ imports it)."""


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off inside the block, as it was after it."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def preload(modules: tuple[str, ...] = TRAINING_MODULES, *, freeze: bool = False) -> None:
    """Import `modules` with the collector paused; with `freeze`, everything alive then is left
    out of every later collection (see the module docstring: only for trainspeed's own
    processes)."""
    with gc_paused():
        for name in modules:
            importlib.import_module(name)
        if freeze:
            gc.freeze()
