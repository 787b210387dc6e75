"""Profiler traces a run recorded (`profile` events): where they are and which steps they hold,
for the terminal report (the path) and the HTML report (a link)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VIEWER_HINT = "open it in https://ui.perfetto.dev or chrome://tracing"


@dataclass(frozen=True, slots=True)
class Trace:
    path: Path
    """The trace file (inside the run directory)."""
    steps: str
    """The captured steps, 'START-END'."""
    exists: bool

    def href(self, page_dir: Path) -> str:
        """A link to the trace from an HTML page written in `page_dir`."""
        try:
            return Path(os.path.relpath(self.path, page_dir)).as_posix()
        except ValueError:  # another drive on Windows
            return self.path.resolve().as_uri()


def profile_traces(run: Any) -> list[Trace]:
    """The `profile` events of a RunData as Traces (a name outside the run dir is not trusted)."""
    out: list[Trace] = []
    base = Path(run.path)
    for event in getattr(run, "events", None) or []:
        data = event.get("data") if isinstance(event, dict) and event.get("type") == "profile" else None
        if not isinstance(data, dict) or not isinstance(data.get("path"), str):
            continue
        name = Path(data["path"]).name  # the file lives in the run directory, whatever was recorded
        captured = data.get("captured") or data.get("steps")
        steps = f"{captured[0]}-{captured[1]}" if isinstance(captured, list) and len(captured) == 2 else "?"
        path = base / name
        out.append(Trace(path=path, steps=steps, exists=path.is_file()))
    return out
