"""Where recipes keep data they generate or tokenize once: `$TRAINSPEED_CACHE`, else
`~/.cache/trainspeed`. Shared by every recipe so one variable moves all of it (CI, tests)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "TRAINSPEED_CACHE"


def cache_dir() -> Path:
    """`$TRAINSPEED_CACHE`, else `~/.cache/trainspeed`."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "trainspeed"
