"""A crash's traceback from the user's first frame on, as `python -m cProfile` and `python -m pdb`
print it: trainspeed's runner and runpy's frames above the script's read as trainspeed crashing."""

from __future__ import annotations

import os
import runpy
from types import TracebackType

import trainspeed

_OURS = (os.path.dirname(os.path.abspath(trainspeed.__file__)) + os.sep,)
_RUNPY = os.path.abspath(runpy.__file__)


def _wrapper(filename: str) -> bool:
    """A frame of the machinery that ran the script: trainspeed's, runpy's, a frozen module's."""
    if filename.startswith("<frozen"):
        return True
    path = os.path.abspath(filename)
    return path == _RUNPY or path.startswith(_OURS)


def from_user_frame(tb: TracebackType | None) -> TracebackType | None:
    """`tb` from its first frame that is not the runner's own; `tb` itself where every frame is
    (a crash inside trainspeed keeps its whole traceback)."""
    first = tb
    while first is not None and _wrapper(first.tb_frame.f_code.co_filename):
        first = first.tb_next
    return first if first is not None else tb
