"""Suite-wide: measured peak FLOP/s are cached per machine in the user's cache dir
(telemetry/peak_cache.py, under $XDG_CACHE_HOME); tests keep theirs in a temporary one."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _peak_cache_in_tmp(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


# Under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`) tests are spread one by one,
# except two kinds that stay together on one worker:
# - those that build or load DeepSpeed's CPU op from the repository's .cache/torch_extensions:
#   two builds of the op into one directory would race;
# - those of a module whose module-scoped fixture does expensive work (a training run shared
#   by its tests): spread over two workers, it would run twice.
# The peak cache needs no such care: each worker's session has its own XDG_CACHE_HOME above.
_DEEPSPEED_OP_MODULES = {"test_deepspeed_script.py", "test_deepspeed_real_scripts.py", "test_deepspeed_knobs.py",
                         "test_deepspeed_engine.py"}


def _shares_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) if info is not None else {}
    return any(d.scope in ("module", "package", "class") for chain in defs.values() for d in chain)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in _DEEPSPEED_OP_MODULES:
            item.add_marker(pytest.mark.xdist_group("deepspeed_op"))
        elif _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
