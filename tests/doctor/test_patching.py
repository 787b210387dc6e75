from __future__ import annotations

import sys
import types

import pytest

from trainspeed.doctor.instrument.imports import PostImportHooks
from trainspeed.doctor.instrument.patching import Patches

pytestmark = pytest.mark.timeout(30)


class Base:
    def f(self):
        return "base"


class Child(Base):
    def g(self):
        return "child"


def test_class_patches_restore_own_and_inherited_attributes():
    p = Patches()
    p.wrap(Child, "f", lambda orig: lambda self: "patched-" + orig(self))
    p.wrap(Child, "g", lambda orig: lambda self: "patched-" + orig(self))
    p.wrap(Child, "missing", lambda orig: orig)  # skipped, no error
    assert Child().f() == "patched-base" and Child().g() == "patched-child"
    p.undo()
    assert "f" not in Child.__dict__  # inherited attribute was not copied onto the subclass
    assert Child().f() == "base" and Child().g() == "child"
    assert len(p) == 0


def test_module_patches_and_handles_undo_newest_first():
    mod = types.ModuleType("m")
    mod.value = 1
    calls = []
    p = Patches()
    p.setattr(mod, "value", 2)
    p.setattr(mod, "value", 3)
    p.call_on_undo(lambda: calls.append(mod.value))
    p.undo()
    assert mod.value == 1 and calls == [3]


def test_post_import_hook_runs_after_module_executes(tmp_path, monkeypatch):
    (tmp_path / "fake_logger_mod.py").write_text("VALUE = 41\ndef log(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hooks = PostImportHooks()
    hooks.add("fake_logger_mod", lambda m: seen.append(m.VALUE))
    hooks.install()
    try:
        import fake_logger_mod  # noqa: F401
    finally:
        hooks.uninstall()
        sys.modules.pop("fake_logger_mod", None)
    assert seen == [41]
    assert hooks not in sys.meta_path


def test_post_import_hook_runs_at_once_for_imported_modules():
    seen = []
    hooks = PostImportHooks()
    hooks.add("json", lambda m: seen.append(m.__name__))
    assert seen == ["json"]
