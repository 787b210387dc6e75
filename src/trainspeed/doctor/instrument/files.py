"""What the script wrote to disk while it ran: files in the working directory that grew or
appeared (log files, TensorBoard event files, checkpoints). A step time that grows together
with a log file points at logging that re-reads or re-writes its history."""

from __future__ import annotations

import os
from pathlib import Path

MAX_ENTRIES = 5000
"""Directory entries visited per snapshot at most (a home directory must not stall us)."""
MAX_DEPTH = 3
SKIP_DIRS = frozenset({".git", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
                       ".pytest_cache", "site-packages", ".cache"})


def snapshot(root: str | Path, *, exclude: Path | None = None) -> dict[str, int]:
    """{path: size} of regular files under root (bounded walk, hidden/venv dirs skipped)."""
    out: dict[str, int] = {}
    root = Path(root)
    excluded = str(exclude.resolve()) if exclude is not None else None
    seen = 0
    stack: list[tuple[Path, int]] = [(root, 0)]
    while stack and seen < MAX_ENTRIES:
        folder, depth = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen >= MAX_ENTRIES:
                break
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth + 1 <= MAX_DEPTH and entry.name not in SKIP_DIRS and not entry.name.startswith("."):
                        if excluded is None or os.path.realpath(entry.path) != excluded:
                            stack.append((Path(entry.path), depth + 1))
                elif entry.is_file(follow_symlinks=False):
                    out[entry.path] = entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return out


def growth(before: dict[str, int], after: dict[str, int], *, limit: int = 10) -> dict[str, object]:
    """Files that grew or appeared between two snapshots, largest growth first."""
    grown = []
    new_files = 0
    new_bytes = 0
    for path, size in after.items():
        old = before.get(path)
        if old is None:
            new_files += 1
            new_bytes += size
        delta = size - (old or 0)
        if delta > 0:
            grown.append({"path": os.path.relpath(path), "before": old, "after": size, "grew": delta})
    grown.sort(key=lambda g: -int(g["grew"]))  # type: ignore[call-overload]
    return {"grown": grown[:limit], "new_files": new_files, "new_bytes": new_bytes,
            "grew_bytes": sum(int(g["grew"]) for g in grown)}  # type: ignore[call-overload]
