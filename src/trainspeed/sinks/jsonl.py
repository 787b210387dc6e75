"""JsonlSink: steps.jsonl and events.jsonl, the run directory's primary record.

Crash safety: a run killed with SIGKILL (OOM killer, preemption, Ctrl-\\) must leave files
in which every line is complete JSON. Python's buffered file objects can flush half a line
when the process dies between two buffer flushes, so we bypass them: a whole batch is
encoded to bytes first and handed to the kernel in a single `os.write` on an `O_APPEND`
file descriptor. The kernel finishes a write to a regular file before a kill takes effect,
so the file ends on a line boundary. (A short write only happens on a full disk or a signal
with a handler; we loop on it, and the continuation is still appended atomically.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainspeed.telemetry import schema


def open_append(path: Path) -> int:
    """An O_APPEND write-only fd; appends from several writers never interleave mid-write."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags, 0o644)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to `fd`, looping on short writes."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


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
        write_all(self._steps_fd, encode_lines(records))

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
