"""JsonlSink: steps.jsonl and events.jsonl, the run directory's primary record.

Crash safety: a run killed with SIGKILL (OOM killer, preemption, Ctrl-\\) must leave files
in which every complete line is valid JSON. Python's buffered file objects can flush half a
line when the process dies between two buffer flushes, so we bypass them: a whole batch is
encoded to bytes first and handed to the kernel in one `os.write` on an `O_APPEND` fd.

That alone is not enough: Linux copies a large write page by page and stops early when a
fatal signal is pending, so a kill can still leave the last line cut short. Readers skip an
unterminated last line, and a sink that reopens the file (a resumed run appending to the same
run directory) first truncates such a torn tail back to the last newline - otherwise the next
record would be glued onto it and both would be lost. The torn bytes were never a complete
record, so nothing that was written is lost.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainspeed.sinks.step_lines import step_lines
from trainspeed.telemetry import schema


def open_append(path: Path) -> int:
    """An O_APPEND write fd, after cutting a torn last line left by a killed writer;
    appends from several writers never interleave mid-write."""
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o644)
    repair_torn_tail(fd)
    return fd


def repair_torn_tail(fd: int, chunk: int = 1 << 16) -> int:
    """Truncate the file behind `fd` to just after its last newline; return the bytes cut.

    A file that is empty or ends in a newline is left alone (the common case costs one
    1-byte read)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return 0
    end = size
    while end > 0:
        start = max(0, end - chunk)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        end = start
    else:
        keep = 0  # not one complete line: the whole file is a torn first record
    os.ftruncate(fd, keep)
    return size - keep


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to `fd`, looping on short writes. A write that fails part
    way (a full disk) is cut back to where it began: the file ends in whole lines, and a later
    write (space freed, a resumed run) is not glued onto a half record."""
    view = memoryview(data)
    start = None
    try:
        while view:
            n = os.write(fd, view)
            if start is None and n < len(view):
                start = os.fstat(fd).st_size - n
            view = view[n:]
    except OSError:
        if start is not None:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
        raise


def encode_lines(records: list[dict[str, Any]]) -> bytes:
    """Records -> one bytes blob of newline-terminated JSON lines (NaN/Inf -> null)."""
    return "".join([schema.dumps(r) + "\n" for r in records]).encode("utf-8")


class JsonlSink:
    """Append step records to <run_dir>/steps.jsonl and events to <run_dir>/events.jsonl."""

    name = "jsonl"

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.steps_path = self.run_dir / schema.STEPS_FILE
        self.events_path = self.run_dir / schema.EVENTS_FILE
        self._steps_fd: int | None = open_append(self.steps_path)
        self._events_fd: int | None = None  # opened on the first event: most runs have few

    def write_steps(self, records: list[dict[str, Any]]) -> None:
        if not records or self._steps_fd is None:
            return
        write_all(self._steps_fd, step_lines(records).encode("utf-8"))

    def write_event(self, event: dict[str, Any]) -> None:
        if self._steps_fd is None:  # closed
            return
        if self._events_fd is None:
            self._events_fd = open_append(self.events_path)
        write_all(self._events_fd, encode_lines([event]))

    def flush(self) -> None:
        # Data is already in the kernel after write(); fsync makes it survive a power loss.
        for fd in (self._steps_fd, self._events_fd):
            if fd is not None:
                os.fsync(fd)

    def close(self) -> None:
        if self._steps_fd is None:
            return
        try:
            self.flush()
        finally:
            for fd in (self._steps_fd, self._events_fd):
                if fd is not None:
                    os.close(fd)
            self._steps_fd = self._events_fd = None
