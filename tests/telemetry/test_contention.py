"""Contention math on numbers: a busy machine is told from a slower script."""

from __future__ import annotations

import numpy as np
import pytest

from trainspeed.telemetry.contention import (
    detect_contention,
    linear_rate,
    load_per_step,
    loaded_mask,
    robust_step_times,
)
from trainspeed.telemetry.sampler import others_cpu_percent
from trainspeed.telemetry.trend import detect_trend

pytestmark = pytest.mark.timeout(30)

N = 200


def _series(seed=0, load=(80, 140), slow=3.0, cpu_inflation=0.0, grow_ms=0.0):
    """Wall and CPU seconds per step of a 10 ms step (CPU 20 ms: two threads), other
    processes' CPU (% of one core) with a load on steps load[0]..load[1], and a 'log' phase
    that grows by grow_ms over the run."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, N + 1, dtype=float)
    log = grow_ms * 1e-3 * steps / N
    base = 0.010 + log
    loaded = (steps >= load[0]) & (steps < load[1])
    wall = base * np.where(loaded, slow, 1.0) * (1 + 0.03 * rng.standard_normal(N))
    cpu = 2 * base * np.where(loaded, 1 + cpu_inflation, 1.0) * (1 + 0.03 * rng.standard_normal(N))
    others = np.where(loaded, 140.0, 5.0) + rng.uniform(0, 10, N)
    phases = {"forward": 0.4 * wall * (0.010 / base), "backward": 0.6 * wall * (0.010 / base),
              "log": wall * (log / base)}
    return steps, wall, cpu, others, phases


def test_others_cpu_percent_is_busy_minus_this_tree():
    assert others_cpu_percent(1.5, 0.5, 1.0) == pytest.approx((50.0, 100.0))
    assert others_cpu_percent(0.4, 0.9, 1.0) == pytest.approx((40.0, 0.0))  # clipped into [0, busy]
    assert all(np.isnan(others_cpu_percent(1.0, 0.5, 0.0)))


def test_load_per_step_takes_the_row_that_covers_the_step_end():
    t = np.array([10.0, 10.25, 10.5, 10.75])
    o = np.array([0.0, 150.0, 0.0, 0.0])
    ends = np.array([9.9, 10.1, 10.3, 10.6, 10.9])
    np.testing.assert_array_equal(load_per_step(ends, t, o, spread=0)[:4], [0.0, 150.0, 0.0, 0.0])
    assert np.isnan(load_per_step(ends, t, o, spread=0)[4])  # after the last row
    np.testing.assert_array_equal(load_per_step(ends, t, o, spread=1)[:4], [150.0, 150.0, 150.0, 0.0])


def test_load_is_contention_not_a_slower_script():
    steps, wall, cpu, others, _ = _series(cpu_inflation=0.3)  # spinning threads: CPU +30 % under load
    found = detect_contention(steps, wall, cpu, others)
    assert found is not None and found.sampled
    assert 60 <= found.loaded_steps <= 60 and found.first_step == 80 and found.last_step == 139
    assert found.slowdown == pytest.approx(2.0, abs=0.2) and found.lost_share == pytest.approx(60 * 0.02 / 3.2, abs=0.03)
    assert "other processes used 1.5 cores (vs 0.1)" in found.message and "explains" in found.message
    assert found.message.startswith("steps 80-139 took ")  # all 60 of them: the range alone


def test_a_script_doing_more_work_under_load_is_not_contention():
    steps, wall, cpu, others, _ = _series(cpu_inflation=2.0)  # CPU time rises as wall does
    assert detect_contention(steps, wall, cpu, others) is None


def test_no_load_and_no_slowdown_give_nothing():
    steps, wall, cpu, others, _ = _series(slow=1.0)
    assert detect_contention(steps, wall, cpu, others) is None  # load but no slowdown
    steps, wall, cpu, _, _ = _series(load=(0, 0))
    assert detect_contention(steps, wall, cpu, np.full(N, 5.0)) is None


def test_without_samples_contention_is_inferred_from_wall_outgrowing_cpu():
    steps, wall, cpu, _, _ = _series()
    found = detect_contention(steps, wall, cpu, None)
    assert found is not None and not found.sampled and "inferred" in found.message


def test_edge_steps_next_to_a_loaded_row_count_by_their_wall_cpu_ratio():
    steps, wall, cpu, others, _ = _series()
    near = others.copy()
    near[75:80] = 140.0  # the row before the load is partly loaded...
    wall[77:80] *= 2.0  # ...and its last steps did wait
    mask = loaded_mask(others, 5.0, near=near, wall=wall, cpu=cpu)
    assert mask[77:80].all() and not mask[75:77].any() and mask[80:139].all()


def test_trend_on_quiet_steps_ignores_on_off_load_but_finds_real_growth():
    steps, wall, cpu, others, phases = _series(load=(120, N + 1))
    # wall time alone: a load from step 120 on reads as a slowdown of the script
    assert detect_trend(steps, wall, phases, min_steps=40) is not None
    mask, times, ph, basis = robust_step_times(wall, cpu, phases, loaded_mask(others))
    assert basis == "quiet" and mask.sum() == 119
    assert detect_trend(steps[mask], times, ph, min_steps=40) is None
    # a log phase growing 10 ms over the run under the same load: found, in 'log'
    steps, wall, cpu, others, phases = _series(grow_ms=10.0)
    mask, times, ph, basis = robust_step_times(wall, cpu, phases, loaded_mask(others))
    found = detect_trend(steps[mask], times, ph, min_steps=40)
    assert found is not None and found.kind == "growth" and found.phase == "log"


def test_cpu_basis_when_the_load_covers_most_of_the_run():
    steps, wall, cpu, others, phases = _series(load=(10, 190))
    mask, times, ph, basis = robust_step_times(wall, cpu, phases, loaded_mask(others))
    assert basis == "cpu" and mask.all()
    # CPU time scaled by the median wall/CPU ratio: flat where the wall time jumped
    assert np.median(times[20:180]) == pytest.approx(np.median(times[:10]), rel=0.15)
    assert robust_step_times(wall, np.full(N, np.nan), phases) is None


def test_linear_rate_of_a_staircase_and_of_noise():
    steps = np.arange(1, 201, dtype=float)
    rss = 100e6 + np.floor(steps / 20) * 2e6  # +2 MB every 20 steps, read once per interval
    rate = linear_rate(steps, rss)
    assert rate.per_1000 == pytest.approx(100e6, rel=0.1) and rate.z > 3
    flat = linear_rate(steps, 100e6 + np.random.default_rng(0).normal(0, 1e5, 200))
    assert abs(flat.per_1000) < 1e6 and flat.z < 3
    assert linear_rate(steps[:5], rss[:5]) is None


def test_loaded_steps_apart_are_counted_out_of_their_range():
    # pytorch/examples' regression read "steps 6-199 (46 steps) took 35 % longer": a count that
    # contradicts the range it follows. Two loads, steps 40-59 and 120-139: 40 of steps 40-139.
    _, wall_a, cpu_a, others_a, _ = _series(load=(40, 60))
    steps, wall_b, cpu_b, others_b, _ = _series(load=(120, 140))
    second = steps >= 100
    wall, cpu, others = (np.where(second, b, a) for a, b in ((wall_a, wall_b), (cpu_a, cpu_b), (others_a, others_b)))
    found = detect_contention(steps, wall, cpu, others)
    assert found is not None and (found.first_step, found.last_step, found.loaded_steps) == (40, 139, 40)
    assert found.message.startswith("40 of steps 40-139 took "), found.message
