"""doctor/instrument/imported.py: which installed libraries' modules a script imported."""

from __future__ import annotations

import importlib
import sys

import pytest

from trainspeed.doctor.instrument.imported import library_imports

pytestmark = pytest.mark.timeout(60)


def test_only_installed_libraries_modules_imported_since_the_snapshot(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "tslib_pkg-1.0.dist-info").mkdir(parents=True)  # an installed distribution's folder
    (site / "tslib_pkg").mkdir()
    (site / "tslib_pkg" / "__init__.py").write_text("")
    (site / "tslib_pkg" / "core.py").write_text("")
    (site / "trainspeedx.py").write_text("")  # another library whose name starts like ours
    own = tmp_path / "project"
    own.mkdir()
    (own / "ts_users_model.py").write_text("")  # the user's module: a code change may edit it
    monkeypatch.syspath_prepend(str(own))
    monkeypatch.syspath_prepend(str(site))
    before = set(sys.modules)
    try:
        importlib.import_module("tslib_pkg.core")
        importlib.import_module("ts_users_model")
        importlib.import_module("trainspeedx")
        names = library_imports(before)
        assert names == ["tslib_pkg", "tslib_pkg.core", "trainspeedx"]  # in import order, parents first
        assert library_imports(set(sys.modules)) == []  # nothing new since
    finally:
        for name in ("tslib_pkg", "tslib_pkg.core", "ts_users_model", "trainspeedx"):
            sys.modules.pop(name, None)
