"""Fault handling: save on SIGTERM/Ctrl-C/SIGHUP/SIGUSR1 at the next step boundary, and recognise OOM errors.

A signal handler must not save a checkpoint itself: it runs between two bytecodes of the
training step, when the model and optimizer may be half-updated. So the handler only sets a
flag; the Trainer checks `saver.requested` at each step boundary, saves, records the event and
calls `saver.exit()`, which raises SystemExit(143) after SIGTERM (the code a shell reports for
"terminated", which schedulers such as SLURM and Kubernetes expect) or re-raises
KeyboardInterrupt after SIGINT. A second Ctrl-C while the save runs interrupts at once; a second
SIGTERM does so only after DUPLICATE_S seconds (launchers such as torchrun send it twice).
SIGHUP (the terminal or SSH session closed) is a SIGTERM that exits 129; it ended a run at once,
with no save and no word, losing every step since the last periodic checkpoint. A SIGHUP that is
ignored (`nohup trainspeed train ...`) or handled by the host stays so. SIGUSR1 (SLURM's warning
before a time limit or a preemption, `sbatch --signal=USR1@90`) is taken the same way, only from
its default action (which ended the run at once); after its save the job is requeued (slurm.py).

    with EmergencySaver() as emergency:
        for batch in loader:
            train_step(batch)
            if emergency.requested:
                manager.save(build_checkpoint(...), step); manager.wait()
                emergency.exit()
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any

from trainspeed.errors import TrainspeedWarning


def is_oom(exc: BaseException) -> bool:
    """True for a device out-of-memory error (CUDA OOM, or a RuntimeError saying so)."""
    try:
        import torch

        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):  # pragma: no cover - very old torch
        pass
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()
    )


class EmergencySaver:
    """Context manager turning SIGTERM/SIGINT into a 'save at the next step boundary' request."""

    SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1")
    ONLY_IF_DEFAULT = ("SIGHUP", "SIGUSR1")
    """Taken over only from the default action: nohup's SIG_IGN keeps a run going, and a host's
    own SIGUSR1 handler (a stack dump, a profiler's toggle) stays the host's."""
    DUPLICATE_S = 5.0
    """A SIGTERM within this many seconds of the first is a duplicate (launchers repeat it);
    one later ends the process at once, as a second Ctrl-C does."""

    def __init__(self, *, on_signal: Callable[[int], None] | None = None, enabled: bool = True):
        self._on_signal = on_signal
        self._enabled = enabled
        self._previous: dict[int, Any] = {}
        self.signum: int | None = None
        """The first signal received, or None."""
        self._first_t = 0.0
        self.installed = False
        """Whether handlers are active (only possible on the main thread)."""

    # -- state ---------------------------------------------------------------------------------
    @property
    def requested(self) -> bool:
        """True once a signal asked for a save-and-exit; check it at each step boundary."""
        return self.signum is not None

    @property
    def signal_name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    @property
    def exit_code(self) -> int | None:
        """128 + signal number, as a shell reports it (SIGTERM -> 143)."""
        return 128 + self.signum if self.signum is not None else None

    def exit(self) -> None:
        """Leave the training loop the way the signal asked: SystemExit(143) or KeyboardInterrupt."""
        if self.signum is None:
            return
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + self.signum)

    # -- handlers --------------------------------------------------------------------------------
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum, self._first_t = signum, now
        elif signum != signal.SIGINT and now - self._first_t < self.DUPLICATE_S:
            # A launcher's duplicate, not a person asking twice: torchrun sends its workers
            # SIGTERM twice within a millisecond, which killed a rank in the middle of its save.
            return
        # The next identical signal gets the default behaviour: a second Ctrl-C raises
        # KeyboardInterrupt immediately; a SIGTERM after the grace period terminates.
        if signum == signal.SIGINT:
            signal.signal(signum, signal.default_int_handler)
        elif now - self._first_t >= self.DUPLICATE_S:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self._on_signal is not None:
            self._on_signal(signum)

    def __enter__(self) -> EmergencySaver:
        if not self._enabled:
            self._ignore_requeue_signal()
            return self
        if threading.current_thread() is not threading.main_thread():
            warnings.warn(
                "EmergencySaver: signal handlers can only be installed on the main thread; "
                "SIGTERM/Ctrl-C will not trigger a checkpoint",
                TrainspeedWarning, stacklevel=2,
            )
            return self
        for name in self.SIGNALS:
            sig = getattr(signal, name, None)
            if sig is None:  # pragma: no cover - SIGTERM is missing on some platforms
                continue
            if name in self.ONLY_IF_DEFAULT and signal.getsignal(sig) is not signal.SIG_DFL:
                continue
            self._previous[sig] = signal.signal(sig, self._handle)
        self.installed = True
        return self

    def _ignore_requeue_signal(self) -> None:
        """A process that leaves the save to another (a DDP rank other than 0: rank 0's state is
        everyone's) ignores SIGUSR1 where its action is the default. SLURM signals every process
        of the job step: under torchrun, rank 1 died of it at once, and rank 0's save met a dead
        peer (a crash save, no requeue). Rank 0 saves and leaves; torchrun then ends the others."""
        sig = getattr(signal, "SIGUSR1", None)
        if sig is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(sig) is signal.SIG_DFL:
            self._previous[sig] = signal.signal(sig, signal.SIG_IGN)

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        self.installed = False
