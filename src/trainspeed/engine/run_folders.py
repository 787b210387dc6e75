"""The folders a run is about to make, noted before it makes them, so that a run whose resume
fails before its first step takes back what it made.

A failed `--resume` (a checkpoint that does not fit the model, say) left a new run folder
behind holding only config.yaml, env.json and an events file: clutter at best, and a folder
that a later `--auto-resume` or run.name check reads as an earlier run. A folder that existed
before the run is never removed, nor anything in it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class NewFolders:
    """Folders that did not exist when the run started."""

    own: tuple[Path, ...]
    """The run's own folders (its run directory, its checkpoint directory): all they hold is
    the run's."""
    parents: tuple[Path, ...]
    """Folders above them that the run makes on the way (a new run.out_dir), innermost first:
    another run may put its folder there meanwhile, so they are removed only when empty."""

    def remove(self) -> None:
        """Take the folders back. Best effort: the error that stopped the run is the one to
        report, not a folder that could not be removed."""
        for path in self.own:
            shutil.rmtree(path, ignore_errors=True)
        for path in self.parents:
            try:
                path.rmdir()  # only an empty folder
            except OSError:
                pass


def new_folders(*targets: str | Path | None) -> NewFolders:
    """Which of `targets` (None: not used) and of the folders above them do not exist yet."""
    own: list[Path] = []
    parents: set[Path] = set()
    for target in targets:
        if target is None:
            continue
        path = Path(target).absolute()
        if path.exists():
            continue
        own.append(path)
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parents.add(parent)
            parent = parent.parent
    innermost_first = sorted(parents - set(own), key=lambda p: len(p.parts), reverse=True)
    return NewFolders(own=tuple(own), parents=tuple(innermost_first))
