"""ResumableSampler resumed on a different number of ranks continues the same epoch order."""

from __future__ import annotations

import pytest

from trainspeed.engine.data.samplers import ResumableSampler
from trainspeed.errors import CheckpointError


def _consume(world: int, per_rank: int, n: int = 40) -> tuple[set[int], dict]:
    shards = [ResumableSampler(n, seed=5, rank=r, world_size=world) for r in range(world)]
    seen: set[int] = set()
    for s in shards:
        seen.update(list(s)[:per_rank])
        s.advance(per_rank)
    return seen, shards[0].state_dict()


@pytest.mark.parametrize("old,new", [(2, 1), (2, 4), (4, 2), (1, 2)])
def test_resume_on_another_world_size_trains_the_rest_exactly_once(old, new):
    seen, state = _consume(old, per_rank=4 if old < new else 2)
    rest: list[int] = []
    for r in range(new):
        s = ResumableSampler(40, seed=5, rank=r, world_size=new)
        s.load_state_dict(state)
        rest += list(s)
    assert not seen & set(rest)                 # nothing trained twice
    assert seen | set(rest) == set(range(40))   # nothing skipped
    assert len(rest) == 40 - len(seen)


def test_uneven_split_is_a_clear_error():
    _, state = _consume(2, per_rank=3)          # 6 samples done; 4 ranks cannot split them
    s = ResumableSampler(40, seed=5, rank=0, world_size=4)
    with pytest.raises(CheckpointError, match=r"saved by 2 ranks after 3 samples each \(6 in this epoch\).*nproc_per_node 2"):
        s.load_state_dict(state)
