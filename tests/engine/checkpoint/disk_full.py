"""An injected full disk (no root, no tmpfs): every file opened for writing under `root` gets
ENOSPC once `budget` bytes in all were written there, the way a filling disk behaves (the write
that crosses the limit writes what fits, then fails)."""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import os
from pathlib import Path


class _FullFile:
    def __init__(self, f, disk: "FullDisk"):
        self._f, self._disk = f, disk

    def write(self, data) -> int:
        view = data if isinstance(data, str) else memoryview(data).cast("B")
        room = self._disk.budget - self._disk.written
        if len(view) > room:
            if room > 0:
                self._f.write(view[:room])
                self._disk.written += room
            self._disk.failures += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._disk.written += len(view)
        return self._f.write(view)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.__exit__(*exc)

    def __iter__(self):
        return iter(self._f)


class FullDisk:
    def __init__(self, root: Path, budget: int):
        self.root, self.budget = str(Path(root).resolve()), budget
        self.written = 0
        self.failures = 0


@contextlib.contextmanager
def full_disk(root: Path, budget: int = 0):
    """Within the block, writes under `root` fail with ENOSPC after `budget` bytes."""
    disk = FullDisk(root, budget)
    real_open = builtins.open

    def fake_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+") and \
                os.path.abspath(os.fspath(file)).startswith(disk.root):
            return _FullFile(f, disk)
        return f

    builtins.open, io.open = fake_open, fake_open
    try:
        yield disk
    finally:
        builtins.open, io.open = real_open, real_open
