"""What checkpoints a directory holds, and which one a run can resume from.

Names are `step-XXXXXXXX.pt` (one file, with its checksum manifest), `step-XXXXXXXX.dcp`
(a sharded directory with its marker) or `step-XXXXXXXX.ds` (DeepSpeed's files, with the same
marker). Listing reads manifests only; `find_resumable`
verifies, newest first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainspeed.engine.checkpoint.atomic import manifest_path, verify
from trainspeed.engine.checkpoint.sharded import SUFFIX as SHARDED_SUFFIX
from trainspeed.engine.checkpoint.sharded import read_marker, verify_dir
from trainspeed.errors import CheckpointError

NAME_RE = re.compile(r"^step-(\d{8,})\.(?:pt|dcp|ds)$")


def checkpoint_name(step: int, *, sharded: bool = False, suffix: str | None = None) -> str:
    return f"step-{step:08d}" + (suffix or (SHARDED_SUFFIX if sharded else ".pt"))


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """verify() for a checkpoint file, verify_dir() for a sharded checkpoint directory."""
    return verify_dir(path) if Path(path).is_dir() else verify(path)


def _read_manifest(entry: Path) -> dict[str, Any] | None:
    try:
        if entry.is_dir():
            return read_marker(entry)
        manifest = json.loads(manifest_path(entry).read_text())
        return manifest if isinstance(manifest, dict) else None
    except (OSError, ValueError, CheckpointError):
        return None


@dataclass(slots=True)
class CheckpointInfo:
    path: Path
    step: int
    manifest: dict[str, Any] | None
    """Parsed manifest, or None when missing/unreadable (the checkpoint cannot be trusted)."""
    metrics: dict[str, Any] = field(default_factory=dict)


def list_checkpoints(directory: str | Path) -> list[CheckpointInfo]:
    """Checkpoints under their final names in `directory`, oldest step first (no verification)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    out = []
    for entry in directory.iterdir():
        m = NAME_RE.match(entry.name)
        if not m:
            continue
        manifest = _read_manifest(entry)
        metrics = (manifest or {}).get("metrics") or {}
        out.append(CheckpointInfo(path=entry, step=int(m.group(1)), manifest=manifest,
                                  metrics=metrics if isinstance(metrics, dict) else {}))
    out.sort(key=lambda info: info.step)
    return out


def find_resumable(directory: str | Path,
                   on_skip: Callable[[Path, str], None] | None = None,
                   check: Callable[[Path], Any] = verify_checkpoint) -> Path | None:
    """Newest checkpoint in `directory` whose checksum verifies (a file) or whose files match
    its marker (a sharded directory), as `check` sees it; corrupt ones go to `on_skip`."""
    for info in reversed(list_checkpoints(directory)):
        try:
            check(info.path)
        except CheckpointError as exc:
            if on_skip is not None:
                on_skip(info.path, str(exc))
            continue
        return info.path
    return None
