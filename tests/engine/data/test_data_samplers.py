from __future__ import annotations

import pytest

from trainspeed.engine.data import ResumableSampler, epoch_seed
from trainspeed.errors import CheckpointError, ConfigError

pytestmark = pytest.mark.timeout(30)


def test_deterministic_per_seed_and_epoch():
    a, b = ResumableSampler(50, seed=1), ResumableSampler(50, seed=1)
    assert list(a) == list(b)
    assert sorted(a) == list(range(50))
    e0 = list(a)
    a.set_epoch(1)
    assert list(a) != e0 and sorted(a) == list(range(50))
    assert list(ResumableSampler(50, seed=2)) != e0
    assert list(ResumableSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]
    # (seed, epoch) pairs do not alias the way seed + epoch would
    assert epoch_seed(0, 1) != epoch_seed(1, 0)


@pytest.mark.parametrize("n,world,drop", [(10, 2, False), (11, 2, False), (11, 3, False), (11, 3, True), (2, 4, False)])
def test_sharding_like_distributed_sampler(n, world, drop):
    shards = [list(ResumableSampler(n, seed=3, rank=r, world_size=world, drop_last=drop)) for r in range(world)]
    sizes = {len(s) for s in shards}
    assert len(sizes) == 1, "every rank must get the same count"
    flat = [i for s in shards for i in s]
    if drop:
        assert len(flat) == (n // world) * world and len(set(flat)) == len(flat)
    else:
        assert set(flat) == set(range(n)), "every sample is seen"
        assert len(flat) == -(-n // world) * world  # padding by repetition only
    if n % world == 0:
        assert sorted(flat) == list(range(n))


def test_batch_size_cut_with_drop_last():
    s = ResumableSampler(23, batch_size=5, drop_last=True)
    assert s.num_samples == 20 and len(list(s)) == 20


def test_resume_mid_epoch_skips_exactly_consumed():
    full = ResumableSampler(40, seed=7)
    full.set_epoch(2)
    order = list(full)
    live = ResumableSampler(40, seed=7)
    live.set_epoch(2)
    it = iter(live)
    seen = [next(it) for _ in range(16)]  # workers prefetched 16 ...
    live.advance(8)  # ... but only 8 were trained on
    state = live.state_dict()
    assert state["epoch"] == 2 and state["consumed"] == 8
    fresh = ResumableSampler(40, seed=7)
    fresh.load_state_dict(state)
    fresh.set_epoch(2)  # the trainer re-selecting the same epoch keeps the position
    assert seen[:8] + list(fresh) == order
    assert len(fresh) == 32


def test_advance_rolls_over_epoch_and_set_epoch_resets():
    s = ResumableSampler(6, batch_size=None)
    s.advance(4)
    s.advance(2)
    assert (s.epoch, s.consumed) == (1, 0)
    s.advance(3)
    s.set_epoch(5)
    assert (s.epoch, s.consumed) == (5, 0)


def test_state_mismatch_and_validation_errors():
    s = ResumableSampler(10, seed=1)
    with pytest.raises(CheckpointError, match="seed"):
        s.load_state_dict({**s.state_dict(), "seed": 2})
    with pytest.raises(CheckpointError, match="dataset_len"):
        ResumableSampler(11, seed=1).load_state_dict(s.state_dict())
    with pytest.raises(CheckpointError, match="consumed"):
        s.load_state_dict({"epoch": 0, "consumed": 99})
    with pytest.raises(ConfigError, match="rank"):
        ResumableSampler(10, rank=2, world_size=2)
    with pytest.raises(ValueError):
        s.advance(-1)
