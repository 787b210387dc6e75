from __future__ import annotations

import pytest
import torch


@pytest.fixture()
def one_thread():
    # Intra-op threads spin-wait; on a small shared CI box two threads can be 10x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """A private TRAINSPEED_CACHE, so tests neither read nor fill the user's cache."""
    from trainspeed.recipes.cache import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"
