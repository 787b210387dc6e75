"""Small file helpers shared by every layer (config, telemetry)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: str | os.PathLike, text: str, *, newline: str | None = None) -> Path:
    """Write text via a temp file in the same directory + rename, so a crash never leaves a
    half-written file under the final name. (Checkpoints also fsync: engine/checkpoint/atomic;
    files that must land together: trainspeed.fileset.) `newline=""` writes the text's line
    ends as they are (a patch of a CRLF file keeps its CRLF lines)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
