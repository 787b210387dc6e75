"""A trial's load from other processes is averaged over its steps' time, not their count."""

from __future__ import annotations

import numpy as np
import pytest

from trainspeed.tune.trial_load import time_weighted_load

pytestmark = pytest.mark.timeout(30)


def test_a_neighbour_that_holds_a_core_most_of_the_time_reads_as_load():
    """word_language_model's baseline beside a test run: 75 s where its neighbours took 10 s, the
    sampler at ~100 % of a core for most of it, but most of its steps, by count, ran fast in the
    neighbour's pauses: the median over steps read 8 %. Here 10 s loaded (100 %, 10 slow steps
    of 1 s) and 1 s quiet (0 %, 100 steps of 10 ms)."""
    slow_ends = np.arange(1, 11, dtype=float)             # steps of 1 s ending at 1..10 s
    fast_ends = 10 + np.arange(1, 101) * 0.01             # then 100 steps of 10 ms
    ends = np.concatenate([slow_ends, fast_ends])
    steps = np.concatenate([np.ones(10), np.full(100, 0.01)])
    sample_t = np.arange(0.25, 11.01, 0.25)               # a sampler row every 0.25 s
    others = np.where(sample_t <= 10, 100.0, 0.0)
    load = time_weighted_load(ends, steps, sample_t, others)
    assert load == pytest.approx(10 / 11, abs=0.03)       # ~0.91 cores over the trial's time
    per_step = [others[np.searchsorted(sample_t, e)] for e in ends]
    assert np.median(per_step) == 0.0                      # what the median over steps read


def test_no_row_inside_the_steps_is_none():
    assert time_weighted_load([1.0, 1.1], [0.05, 0.05], [5.0, 6.0], [100.0, 100.0]) is None
    assert time_weighted_load([], [], [1.0], [50.0]) is None
