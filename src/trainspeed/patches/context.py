"""What every setting's installer receives: `InstallContext` holds the shared Patches,
PostImportHooks, the Targets and the notes list. Its own module so that the installers
(loader, model, hf, ...) import it without importing the registry in `settings`, which
imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from trainspeed.patches.imports import PostImportHooks
from trainspeed.patches.machinery import Patches
from trainspeed.patches.targets import Targets


@dataclass(kw_only=True)
class InstallContext:
    patches: Patches
    imports: PostImportHooks
    targets: Targets
    notes: list[str]
    say: Callable[[str], None] = lambda text: None
    shared: dict[str, Any] = field(default_factory=dict)
    """State one family shares between its settings (the trained-module finder)."""

    def note(self, text: str) -> None:
        self.notes.append(text)


__all__ = ["InstallContext"]
