"""SIGTERM and SIGHUP turned into an exception while a command runs, so it can say what it kept.

`timeout 10m ...`, a scheduler (SIGTERM) and a closed terminal or SSH session (SIGHUP) ended the
doctor and the tune without a word. Each signal is taken only where its action is the default:
a host's own handler, or nohup's ignored SIGHUP, stays as it was. A second one ends the process.
(`trainspeed train` saves at the step boundary instead: engine/checkpoint/emergency.py.)
"""

from __future__ import annotations

import signal
import threading
from typing import Callable


def raise_on_stop_signals(make: Callable[[int], BaseException], also: tuple[str, ...] = ()) -> Callable[[], None]:
    """Raise `make(signum)` on SIGTERM or SIGHUP (and the signals named in `also`), where their
    action is the default; returns the undo. Off the main thread (a command started from a
    library's thread), nothing. The tune adds SIGUSR1 (SLURM's warning before a time limit,
    `sbatch --signal=USR1@90`, whose default action ended it without a word); the doctor adds it
    only after the script's first step: the script it runs may take SIGUSR1 itself (Lightning's
    SLURM auto-requeue does, only where no handler is set)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handle(signum: int, frame: object) -> None:
        signal.signal(signum, signal.SIG_DFL)  # a second one ends the process
        raise make(signum)

    wanted = (signal.SIGTERM, getattr(signal, "SIGHUP", None), *(getattr(signal, name, None) for name in also))
    taken = [sig for sig in wanted if sig is not None and signal.getsignal(sig) is signal.SIG_DFL]
    for sig in taken:
        signal.signal(sig, handle)

    def undo() -> None:
        for sig in taken:
            signal.signal(sig, signal.SIG_DFL)
    return undo


__all__ = ["raise_on_stop_signals"]
