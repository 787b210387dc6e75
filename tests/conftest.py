"""Suite-wide: measured peak FLOP/s are cached per machine in the user's cache dir
(telemetry/peak_cache.py, under $XDG_CACHE_HOME); tests keep theirs in a temporary one."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _peak_cache_in_tmp(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield
