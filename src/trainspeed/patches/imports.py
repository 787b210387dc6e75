"""Post-import hooks: patch a library when (and only if) the script imports it.

Importing tensorboard or wandb ourselves would slow every doctor run and change the script's
environment, so a meta-path finder watches for the module names and runs the patch right
after the module's code has executed. Already-imported modules are patched at once.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Callable

Callback = Callable[[ModuleType], None]


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, callback: Callback) -> None:
        self._inner = inner
        self._callback = callback

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)  # type: ignore[attr-defined]
        self._callback(module)


class PostImportHooks(importlib.abc.MetaPathFinder):
    """Run `callback(module)` once `name` is imported. `install()` / `uninstall()`."""

    def __init__(self) -> None:
        self._callbacks: dict[str, Callback] = {}
        self._busy: set[str] = set()

    def add(self, name: str, callback: Callback) -> None:
        module = sys.modules.get(name)
        if module is not None:
            callback(module)
        else:
            self._callbacks[name] = callback

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        callback = self._callbacks.get(fullname)
        if callback is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)  # asks the other finders
        except (ImportError, ValueError):
            spec = None
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        del self._callbacks[fullname]  # once
        spec.loader = _Loader(spec.loader, callback)
        return spec

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        self._callbacks.clear()
