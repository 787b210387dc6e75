"""trainspeed/startup.py: imports with the cyclic collector paused, and frozen only on request."""

from __future__ import annotations

import gc
import sys

import pytest

from trainspeed.startup import gc_paused, preload

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def fresh_module(tmp_path, monkeypatch):
    """A module that, imported, makes 3000 objects and one reference cycle among them."""
    (tmp_path / "ts_startup_probe.py").write_text(
        "class Node:\n    pass\n"
        "NODES = [Node() for _ in range(3000)]\n"
        "NODES[0].me = NODES[0]\n"
        "COLLECTIONS = __import__('gc').get_stats()[0]['collections']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "ts_startup_probe"
    sys.modules.pop("ts_startup_probe", None)


@pytest.mark.parametrize("was_on", [True, False])
def test_the_collector_is_off_inside_and_as_it_was_after(was_on):
    (gc.enable if was_on else gc.disable)()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is was_on
        with pytest.raises(ValueError), gc_paused():
            raise ValueError("an import that fails")
        assert gc.isenabled() is was_on
    finally:
        gc.enable()


def test_preload_runs_no_collection_while_importing_and_freezes_nothing_unasked(fresh_module):
    before_frozen = gc.get_freeze_count()
    before = gc.get_stats()[0]["collections"]
    preload((fresh_module,))
    module = sys.modules[fresh_module]
    assert module.COLLECTIONS == before  # 3000 allocations and not one generation-0 pass
    assert gc.isenabled() and gc.get_freeze_count() == before_frozen
    assert gc.is_tracked(module.NODES[0])


def test_preload_with_freeze_leaves_what_was_imported_out_of_later_collections(fresh_module):
    before_frozen = gc.get_freeze_count()
    try:
        preload((fresh_module,), freeze=True)
        assert gc.isenabled()
        # the module's 3000 nodes (and the rest of this process's heap) are in the permanent
        # generation: a full collection no longer scans them
        assert gc.get_freeze_count() >= before_frozen + 3000
    finally:
        gc.unfreeze()
