"""The Sink protocol: where step records and events go.

Sinks are called only from the AsyncWriter's background thread (never from the training
thread), so a sink may block on disk or network without slowing training.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Sink(Protocol):
    """Optional class attributes: `name` (for messages) and `thinnable = True` for a
    dashboard that may be sent every k-th step record when the writer falls behind (see
    writer.py); sinks without it receive every record."""

    def write_steps(self, records: list[dict[str, Any]]) -> None:
        """Write a batch of step records (see telemetry/schema.py)."""

    def write_event(self, event: dict[str, Any]) -> None:
        """Write one event record."""

    def flush(self) -> None:
        """Make everything written so far durable/visible."""

    def close(self) -> None:
        """Flush and release resources. Called once."""


class NullSink:
    """The default do-nothing sink."""

    def write_steps(self, records: list[dict[str, Any]]) -> None:
        pass

    def write_event(self, event: dict[str, Any]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
