"""One JSON file of a run directory, written atomically.

Its own small module so that code rundir itself reaches (env -> peaks, which notes the
peak in env.json) can write JSON without importing rundir back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainspeed.fileio import atomic_write_text
from trainspeed.telemetry import schema

__all__ = ["write_json"]


def write_json(path: str | Path, obj: Any) -> Path:
    """Write JSON atomically (temp file in the same directory, then rename)."""
    return atomic_write_text(Path(path), json.dumps(schema.sanitize_any(obj), indent=2) + "\n")
