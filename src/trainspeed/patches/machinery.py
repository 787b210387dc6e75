"""Reversible monkey-patching: every patch the doctor (observing) or a setting (changing a
script, `trainspeed.patches`) installs is undone, in reverse order.

Tests run many doctors in one process, so an uninstall that leaves a wrapper behind would
stack wrappers run after run. `Patches` records exactly what it replaced: for a class it looks
only at the class's own `__dict__` (so restoring never copies an inherited attribute onto a
subclass), for a module it restores the module attribute.
"""

from __future__ import annotations

from typing import Any, Callable

_MISSING = object()


class Patches:
    """A stack of undo actions (attribute patches and hook handles)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def setattr(self, owner: Any, name: str, value: Any) -> Any:
        """Replace `owner.name` by `value`; return the original (what callers should wrap)."""
        if isinstance(owner, type):
            own = owner.__dict__.get(name, _MISSING)
            original = getattr(owner, name)
        else:
            own = getattr(owner, name, _MISSING)
            original = own
        setattr(owner, name, value)

        def undo() -> None:
            if own is _MISSING:
                try:
                    delattr(owner, name)
                except AttributeError:  # already gone: nothing to restore
                    pass
            else:
                setattr(owner, name, own)

        self._undo.append(undo)
        return original

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """`owner.name = make(original)`; a missing attribute is skipped (older torch)."""
        if not hasattr(owner, name):
            return
        original = getattr(owner, name)
        self.setattr(owner, name, make(original))

    def handle(self, handle: Any) -> None:
        """Remember a RemovableHandle (torch hooks) to remove on undo."""
        self._undo.append(handle.remove)

    def call_on_undo(self, fn: Callable[[], None]) -> None:
        self._undo.append(fn)

    def undo(self) -> None:
        """Undo everything, newest first. Errors in one undo do not stop the others."""
        errors: list[BaseException] = []
        while self._undo:
            action = self._undo.pop()
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - keep undoing; re-raise the first below
                errors.append(exc)
        if errors:
            raise errors[0]

    def __len__(self) -> int:
        return len(self._undo)
