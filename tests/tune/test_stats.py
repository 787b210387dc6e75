"""The tuner's statistics on synthetic step times: a fast knob, a slow one, a noisy one."""

import math

import numpy as np
import pytest

from trainspeed.tune import stats
from trainspeed.tune.stats import Arm


def arm(mean, rel_noise=0.01, repeats=2, steps=25, samples=16, seed=0, shift=None):
    """Synthetic repeats: step times around `mean` (s); `shift[r]` scales repeat r."""
    rng = np.random.default_rng(seed)
    times, smp = [], []
    for r in range(repeats):
        scale = shift[r] if shift else 1.0
        times.append(mean * scale * (1 + rel_noise * rng.standard_normal(steps)))
        smp.append(np.full(steps, samples))
    return Arm.of(times, smp)


def test_cost_is_step_time_per_sample_and_ignores_a_stolen_step():
    t = np.array([0.1, 0.1, 0.1, 5.0, 0.1])  # one step a neighbour's process stole
    assert stats.cost_per_sample(t, np.full(5, 10.0)) == pytest.approx(0.01)
    assert math.isnan(stats.cost_per_sample(np.array([]), np.array([])))


def test_cost_counts_the_periodic_waits_of_a_loader_that_falls_behind():
    """Every third step waits 0.2 s for a slow worker: a third of the time is waiting, and a
    median step time (0.1) would report the loader as free."""
    t = np.array([0.1, 0.1, 0.3] * 40)
    assert stats.cost_per_sample(t, np.full(len(t), 10.0)) == pytest.approx((0.1 * 80 + 0.3 * 34) / 114 / 10)


def test_an_epoch_start_counts_once_per_epoch():
    """A 2 s worker restart at the epoch start of a 50-step epoch costs 0.04 s a step: not
    trimmed away as a stolen step, not weighed as 1 of the trial's 30 steps."""
    t = np.full(30, 0.1)
    t[20] += 2.0
    starts = np.zeros(30, bool)
    starts[20] = True
    samples = np.full(30, 10.0)
    assert stats.cost_per_sample(t, samples) == pytest.approx(0.01)  # unknown: the old figure
    assert stats.cost_per_sample(t, samples, starts, 50) == pytest.approx((0.1 + 2.0 / 50) / 10)
    assert stats.cost_per_sample(t, samples, starts, None) == pytest.approx(0.01)


def test_persistent_workers_win_when_trials_see_an_epoch_start():
    rng = np.random.default_rng(3)

    def repeats(restart_s):
        times, starts = [], []
        for _ in range(2):
            t = 0.1 * (1 + 0.01 * rng.standard_normal(50))
            t[45] += restart_s
            times.append(t)
            starts.append(np.arange(50) == 45)
        return Arm.of(times, [np.full(50, 16.0)] * 2, starts, steps_per_epoch=50)

    c = stats.compare(repeats(restart_s=2.0), repeats(restart_s=0.0))  # non-persistent vs persistent
    assert c.speedup == pytest.approx(1.4, rel=0.02)
    assert 1.3 < c.ci_low <= c.ci_high < 1.5
    assert stats.speed_verdict(c) == stats.FASTER
    assert stats.repeat_costs(repeats(2.0))[0] == pytest.approx((0.1 + 0.04) / 16, rel=0.02)


def test_fast_knob_is_faster_with_interval_above_one():
    c = stats.compare(arm(0.10, seed=1), arm(0.05, seed=2))
    assert c.speedup == pytest.approx(2.0, rel=0.02)
    assert 1.9 < c.ci_low <= c.speedup <= c.ci_high < 2.1
    assert stats.speed_verdict(c) == stats.FASTER


def test_slow_knob_is_slower():
    c = stats.compare(arm(0.10, seed=1), arm(0.30, seed=2))
    assert c.speedup == pytest.approx(1 / 3, rel=0.02)
    assert stats.speed_verdict(c) == stats.SLOWER


def test_noisy_knob_without_real_change_is_no_measurable_change():
    c = stats.compare(arm(0.10, seed=1), arm(0.10, rel_noise=0.4, seed=2))
    assert c.ci_low < 1.0 < c.ci_high
    assert stats.speed_verdict(c) == stats.NO_CHANGE


def test_small_true_change_below_min_effect_is_not_a_win():
    # 2% faster with almost no noise: statistically clear, but below the 3% floor.
    c = stats.compare(arm(0.10, rel_noise=0.001, seed=1), arm(0.098, rel_noise=0.001, seed=2))
    assert c.ci_low > 1.0
    assert stats.speed_verdict(c) == stats.NO_CHANGE
    assert stats.speed_verdict(stats.compare(arm(0.10, rel_noise=0.001, seed=1),
                                             arm(0.098, rel_noise=0.001, seed=2),
                                             min_effect=0.01)) == stats.FASTER


def test_run_to_run_noise_of_the_baseline_raises_the_bar():
    # The baseline's two repeats differ by 12% (machine drift): an 8% gain is inside that.
    base = arm(0.10, rel_noise=0.002, shift=[1.0, 1.12], seed=1)
    assert stats.run_to_run_noise(base) == pytest.approx(0.12, abs=0.01)
    cand = arm(0.10 * 1.06 / 1.08, rel_noise=0.002, seed=2)
    c = stats.compare(base, cand)
    assert c.noise == pytest.approx(0.12, abs=0.01)
    assert stats.speed_verdict(c) == stats.NO_CHANGE
    # a 2x gain clears it
    assert stats.speed_verdict(stats.compare(base, arm(0.053, seed=3))) == stats.FASTER


def test_one_odd_round_of_three_does_not_set_the_noise():
    """Verification rounds read 1.19x, 1.76x (a slow baseline trial) and 1.23x: the median
    pair spread was 43 % and refused it; the median deviation is 3 %, x2 = 6.5 %."""
    base = arm(0.10, rel_noise=0.002, repeats=3, shift=[1.0, 1.76 / 1.19, 1.23 / 1.19], seed=1)
    cand = arm(0.10 / 1.19, rel_noise=0.002, repeats=3, seed=2)
    assert stats.paired_noise(base, cand) == pytest.approx(0.065, abs=0.01)
    assert stats.speed_verdict(stats.compare(base, cand)) == stats.FASTER


def test_drift_between_rounds_that_moves_both_arms_is_not_noise():
    """The machine runs 40 % slower in round 2 for both arms (interleaving puts them side by
    side): a steady 1.15x gain in each round is a result. The arms' own spread (40 %) would
    have called it noise; the rounds' ratios agree."""
    base = arm(0.10, rel_noise=0.002, shift=[1.0, 1.4], seed=1)
    cand = arm(0.10 / 1.15, rel_noise=0.002, shift=[1.0, 1.4], seed=2)
    assert stats.run_to_run_noise(base) == pytest.approx(0.4, abs=0.01)
    c = stats.compare(base, cand)
    assert stats.paired_noise(base, cand) < 0.01 and c.noise == pytest.approx(0.03)  # min_effect
    assert c.speedup == pytest.approx(1.15, abs=0.01)
    assert stats.speed_verdict(c) == stats.FASTER
    # Drift inside a round (only the candidate's repeat 2 ran slow) is noise of the ratio.
    jolted = arm(0.10 / 1.15, rel_noise=0.002, shift=[1.0, 1.4 * 1.2], seed=2)
    assert stats.paired_noise(base, jolted) == pytest.approx(0.18, abs=0.01)  # |q1 - q2| / mean
    assert stats.speed_verdict(stats.compare(base, jolted)) == stats.NO_CHANGE


def test_one_drifted_repeat_among_many_does_not_set_the_noise():
    """Four baseline repeats over a tune session, one of them taken while the machine was 25 %
    slower: noise is the rounds' typical deviation, not their range, which only grows with
    repeats. A 1.21x gain then counts; it would not against the 25 % range."""
    base = arm(0.10, rel_noise=0.002, repeats=4, shift=[1.0, 1.08, 1.25, 1.07], seed=1)
    assert stats.run_to_run_noise(base) == pytest.approx(0.125, abs=0.02)  # median of six pairs
    cand = arm(0.1075 / 1.21, rel_noise=0.002, repeats=4, shift=[1.0, 1.02, 1.0, 1.03], seed=2)
    c = stats.compare(base, cand)
    assert c.speedup == pytest.approx(1.21, abs=0.03)
    # The rounds' ratios vary as 1.0, 1.06, 1.25, 1.04: the odd round does not set the noise
    # (twice the median deviation from the median ratio, ~5.6 %).
    assert c.noise == pytest.approx(0.056, abs=0.01)
    assert stats.speed_verdict(c) == stats.FASTER
    # the same candidate inside the noise stays "no measurable change"
    near = arm(0.1075 / 1.04, rel_noise=0.002, repeats=4, shift=[1.0, 1.02, 1.0, 1.03], seed=3)
    assert stats.speed_verdict(stats.compare(base, near)) == stats.NO_CHANGE


def test_cost_is_per_sample_so_bigger_batches_compare_fairly():
    # Double the samples per step at 1.5x the step time: 1.33x faster per sample.
    base = arm(0.10, samples=16, seed=1)
    bigger = arm(0.15, samples=32, seed=2)
    assert stats.compare(base, bigger).speedup == pytest.approx(4 / 3, rel=0.02)


def test_loss_parity_overrides_speed():
    c = stats.compare(arm(0.10, seed=1), arm(0.05, seed=2))
    assert stats.loss_delta(2.0, float("nan")) == math.inf
    assert stats.verdict(c, math.inf, tolerance=0.05) == stats.LOSS_MISMATCH
    assert stats.verdict(c, 0.08, tolerance=0.05) == stats.LOSS_MISMATCH
    assert stats.verdict(c, 0.02, tolerance=0.05) == stats.FASTER
    assert stats.verdict(c, -0.30, tolerance=0.05) == stats.FASTER  # a lower loss is no mismatch
    assert stats.verdict(c, None, tolerance=0.05) == stats.FASTER
    assert stats.verdict(None, 0.0, tolerance=0.05, failed=True) == stats.FAILED


def test_loss_delta_is_relative():
    assert stats.loss_delta(2.0, 2.2) == pytest.approx(0.1)
    assert stats.loss_delta(None, 2.0) is None
    assert stats.loss_delta(2.0, None) is None


def test_arm_rejects_misaligned_samples():
    with pytest.raises(ValueError):
        Arm.of([[0.1, 0.2]], [[1.0]])


def test_pooled_round_noise_is_the_machines_spread_over_many_comparisons():
    """Twelve comparisons of two rounds each, every round's log speedup off by N(0, 0.15):
    the pooled spread recovers 0.15 although each comparison alone sees one difference."""
    rng = np.random.default_rng(4)
    comparisons = [list(np.log(1.1) + 0.15 * rng.standard_normal(2)) for _ in range(12)]
    assert stats.pooled_round_sd(comparisons) == pytest.approx(0.15, rel=0.3)
    assert stats.pooled_round_sd(comparisons[:2]) == 0.0  # 4 residuals: too few to trust
    assert stats.pooled_round_sd([[0.1]] * 10) == 0.0  # one round each: no spread to see
    # one wild comparison does not set it (a median, not a mean of squares)
    wild = comparisons + [[-1.0, 1.0]]
    assert stats.pooled_round_sd(wild) == pytest.approx(stats.pooled_round_sd(comparisons), rel=0.25)
    # two standard errors of the mean of n rounds, as a relative speedup
    assert stats.pooled_noise(0.15, 4) == pytest.approx(math.exp(0.15) - 1)
    assert stats.pooled_noise(0.0, 4) == 0.0


def test_two_rounds_that_agree_by_chance_are_judged_by_the_machines_noise():
    """A 1.12x reading whose two rounds agree (1 % apart) passes on its own rounds' spread; on
    a machine whose rounds scatter by 15 % (pooled over the tune) two rounds cannot tell 12 %
    from noise, and four rounds of a 1.4x gain can."""
    base = arm(0.112, rel_noise=0.002, shift=[1.0, 1.01], seed=1)
    cand = arm(0.10, rel_noise=0.002, seed=2)
    assert stats.speed_verdict(stats.compare(base, cand)) == stats.FASTER
    c = stats.compare(base, cand, round_sd=0.15)
    assert c.noise == pytest.approx(math.exp(2 * 0.15 / math.sqrt(2)) - 1)
    assert stats.speed_verdict(c) == stats.NO_CHANGE
    big = stats.compare(arm(0.14, repeats=4, seed=3), arm(0.10, repeats=4, seed=4), round_sd=0.15)
    assert stats.speed_verdict(big) == stats.FASTER
