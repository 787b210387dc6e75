"""Disk space: tell a full disk from other write failures, name it in one line, warn before.

A full disk surfaces in many forms: OSError(ENOSPC) from a plain write, torch.save's
`[enforce fail at inline_container.cc] unexpected pos ...` (its zip writer swallows the
OSError of the file it writes through), DCP's CheckpointException wrapping each rank's
error, DeepSpeed's own RuntimeError. `no_space(exc, directory)` recognises all of them (the
errno anywhere in the exception chain, or, for the opaque torch/DeepSpeed errors, a disk that
is in fact (nearly) full), and `disk_full(...)` builds the one-line DiskFullError.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from trainspeed.errors import NO_SPACE_ERRNOS, CheckpointError, DiskFullError

_NO_SPACE_TEXT = ("no space left on device", "disk quota exceeded", "[errno 28]")
# Opaque writer errors (torch's zip writer, DeepSpeed) are read as "disk full" only when the
# disk has less than this left after the failure: a truly full disk, not a guess.
_NEARLY_FULL = 1 << 20


def _chain(exc: BaseException | None, depth: int = 0):
    """`exc`, its causes/contexts and (DCP) each rank's wrapped failure."""
    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < 32:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)  # DCP's CheckpointException: {rank: (exc, tb)}
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]


def text_says_no_space(text: str) -> bool:
    """True when an error's text says the disk is full (ENOSPC/EDQUOT's words or errno): also
    for a failed process's stderr (tune/store.py)."""
    return any(t in text.lower() for t in _NO_SPACE_TEXT)


def says_no_space(exc: BaseException | None) -> bool:
    """True when the error (or one it wraps) is ENOSPC/EDQUOT or says so."""
    for e in _chain(exc):
        if isinstance(e, DiskFullError):
            return True
        if isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS:
            return True
        if text_says_no_space(str(e)):
            return True
    return False


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes on the filesystem holding `path` (its nearest existing ancestor)."""
    p = Path(path).absolute()
    for candidate in (p, *p.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def nearly_full(directory: str | os.PathLike) -> bool:
    """Whether the disk under `directory` has less than _NEARLY_FULL left."""
    free = free_bytes(directory)
    return free is not None and free < _NEARLY_FULL


def no_space(exc: BaseException | None, directory: str | os.PathLike) -> bool:
    """Whether a failed write into `directory` failed for lack of space."""
    return says_no_space(exc) or nearly_full(directory)


def state_bytes(obj: Any) -> int:
    """Bytes of the tensors in a (nested) state dict: about what torch.save writes."""
    total = 0
    todo = [obj]
    seen: set[int] = set()
    while todo:
        x = todo.pop()
        if isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, (list, tuple)):
            todo.extend(x)
        elif hasattr(x, "untyped_storage") and hasattr(x, "nbytes"):
            try:
                key = x.untyped_storage().data_ptr()
            except (RuntimeError, NotImplementedError):
                key = id(x)
            if key in seen and key != 0:
                continue
            seen.add(key)
            try:
                total += int(x.nbytes)
            except (RuntimeError, TypeError):  # a DTensor/ShardedTensor: its local part
                local = getattr(x, "_local_tensor", None)
                total += int(getattr(local, "nbytes", 0) or 0)
    return total


def disk_full(directory: str | os.PathLike, needed: int | None, *, what: str = "checkpoint",
              cause: BaseException | None = None) -> DiskFullError:
    """The one-line error for a write into `directory` that ran out of space."""
    err = DiskFullError(Path(directory), needed, free_bytes(directory), what=what)
    if cause is not None:
        err.__cause__ = cause
    return err


def low_space_note(directory: str | os.PathLike, needed: int, *, margin: float = 1.2) -> str | None:
    """A warning when `directory`'s disk has less than `margin` x `needed` bytes free (the next
    save would likely fail), else None. One statvfs call: cheap enough before every save."""
    free = free_bytes(directory)
    if free is None or needed <= 0 or free >= margin * needed:
        return None
    return (f"only {free / 1e6:.1f} MB free on {directory}; the next checkpoint needs about "
            f"{needed / 1e6:.1f} MB: free space or point checkpoint.dir at a larger disk")


class SpaceCheck:
    """Before each save: warn once when the disk has less room than the save needs (the
    previous save's size; before the first, the state's tensors). A statvfs call per save."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = directory
        self.last_bytes = 0
        """Bytes the newest save wrote: what the next one needs (also the full-disk message's)."""
        self.warned = False

    def before_save(self, state: Any) -> str | None:
        """The warning to give now, or None."""
        if self.warned:
            return None
        if not self.last_bytes:
            self.last_bytes = state_bytes(state)
        note = low_space_note(self.directory, self.last_bytes)
        self.warned = note is not None
        return note

    def saved(self, nbytes: int) -> int:
        self.last_bytes = nbytes
        return nbytes


def make_directory(directory: Path) -> None:
    """mkdir -p, with a full disk or an unwritable place said in one line."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if says_no_space(exc):
            raise disk_full(directory, None, cause=exc) from exc
        raise CheckpointError(f"cannot create the checkpoint directory {directory}: "
                              f"{exc.strerror or exc}; set checkpoint.dir to a writable place") from exc
