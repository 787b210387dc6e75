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
    # frozen objects can be freed (the count falls), never added
    assert gc.isenabled() and gc.get_freeze_count() <= before_frozen
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


def test_only_a_process_of_its_own_freezes(monkeypatch):
    """`trainspeed train` called as a function (main([...]): a test, a notebook) leaves its
    host's collector alone; run as the program (main() reads sys.argv) it freezes."""
    from trainspeed.cli import _target
    from trainspeed.cli.main import main

    seen = []
    monkeypatch.setattr("trainspeed.startup.preload", lambda *a, freeze=False: seen.append(freeze))

    def stop(*args, **kwargs):
        raise RuntimeError("stopped after the preload")

    monkeypatch.setattr(_target, "load", stop)
    with pytest.raises(RuntimeError, match="after the preload"):
        main(["train", "gpt", "--no-report"])
    monkeypatch.setattr(sys, "argv", ["trainspeed", "train", "gpt", "--no-report"])
    with pytest.raises(RuntimeError, match="after the preload"):
        main()
    assert seen == [False, True]
