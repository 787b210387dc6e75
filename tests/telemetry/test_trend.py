from __future__ import annotations

import numpy as np
import pytest

from trainspeed.telemetry.trend import change_point, detect_trend, robust_clip, theil_sen

pytestmark = pytest.mark.timeout(120)

BASE = {"data": 0.5e-3, "forward": 1.5e-3, "backward": 2.0e-3, "optimizer": 0.5e-3, "log": 0.5e-3}  # 5 ms


def synth(seed, n=500, *, noise=0.08, heavy=False, growth=0.0, onset=0, jump=0.0, jump_at=0, phase="log", spikes=5):
    """Noisy per-phase step times (5 ms total); `growth` adds growth*5 ms linearly from `onset` to the
    end, `jump` adds jump*5 ms from `jump_at` on, both in `phase`; a few 3-10x outlier steps."""
    rng = np.random.default_rng(seed)
    steps = np.arange(n)
    phases = {}
    for name, b in BASE.items():
        z = rng.standard_t(3, n) / np.sqrt(3) if heavy else rng.standard_normal(n)
        phases[name] = b * np.clip(1 + noise * z, 0.2, None)
    phases[phase] = phases[phase] + growth * 5e-3 * np.maximum(0, steps - onset) / max(1, n - onset)
    phases[phase] = phases[phase] + jump * 5e-3 * (steps >= jump_at)
    t = sum(phases.values())
    idx = rng.choice(n, spikes, replace=False)
    t[idx] *= rng.uniform(3, 10, spikes)
    phases["other"] = t - sum(phases[k] for k in BASE)
    return steps, t, phases


# ---------------------------------------------------------------- theil_sen


def test_theil_sen_exact_line():
    x = np.arange(10.0)
    slope, intercept = theil_sen(x, 2 * x + 1)
    assert slope == pytest.approx(2.0) and intercept == pytest.approx(1.0)


def test_theil_sen_hand_computed_small():
    # Pairs of (0,0),(1,1),(2,5): slopes 1, 2.5, 4 -> median 2.5; residuals 0, -1.5, 0 -> intercept 0.
    assert theil_sen([0, 1, 2], [0, 1, 5]) == (pytest.approx(2.5), pytest.approx(0.0))


def test_theil_sen_ignores_outliers_and_nan():
    x = np.arange(100.0)
    y = 0.5 * x + 3
    y[[5, 40, 77]] = 1e6  # least squares would be ruined
    y[10] = np.nan
    slope, intercept = theil_sen(x, y)
    assert slope == pytest.approx(0.5) and intercept == pytest.approx(3.0)


def test_theil_sen_subsamples_long_series_deterministically():
    x = np.arange(200_000.0)
    y = -3.0 * x + 7.0
    a = theil_sen(x, y, max_points=300)  # 44,850 pairs instead of 2e10
    assert a == (pytest.approx(-3.0), pytest.approx(7.0))
    assert theil_sen(x, y, max_points=300) == a


def test_theil_sen_degenerate():
    assert all(np.isnan(v) for v in theil_sen([1.0], [2.0]))
    assert all(np.isnan(v) for v in theil_sen([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))


def test_robust_clip_only_touches_spikes():
    rng = np.random.default_rng(0)
    y = 1.0 + 0.01 * rng.standard_normal(101)
    spikes = [0, 50, 100]  # including both ends, where a running median is weakest
    y[spikes] = [40.0, 50.0, 60.0]
    out = robust_clip(y)
    assert np.all(out[spikes] < 1.1)
    rest = np.setdiff1d(np.arange(101), spikes)
    assert np.mean(out[rest] == y[rest]) > 0.95


# ---------------------------------------------------------------- change_point


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("heavy", [False, True])
def test_change_point_finds_a_step_within_10(seed, heavy):
    _, t, _ = synth(seed, n=500, heavy=heavy, noise=0.1, jump=0.15, jump_at=300)
    k = change_point(t)
    assert k is not None and abs(k - 300) <= 10


def test_change_point_hand_made_step():
    y = np.r_[np.zeros(30), np.ones(30)] + np.tile([0.01, -0.01], 30)
    assert change_point(y, min_size=10) == 30


@pytest.mark.parametrize("seed", range(20))
def test_change_point_none_on_stable_noise(seed):
    _, t, _ = synth(seed, n=500, heavy=seed % 2 == 1, noise=0.1)
    assert change_point(t) is None


def test_change_point_too_short():
    assert change_point(np.r_[np.zeros(10), np.ones(10)], min_size=20) is None


# ---------------------------------------------------------------- detect_trend


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("heavy", [False, True])
def test_detect_trend_finds_planted_10pct_growth_and_names_phase(seed, heavy):
    # 5 ms step, grows linearly by 10 % (0.5 ms) over 500 steps, all of it in 'log'.
    steps, t, phases = synth(seed, n=500, heavy=heavy, noise=0.1, growth=0.10, phase="log")
    trend = detect_trend(steps, t, phases)
    assert trend is not None
    assert trend.kind == "growth"
    assert trend.phase == "log"
    # 10 % per 500 steps = 20 % per 1,000 steps; Theil-Sen on noisy data lands within a few %.
    assert 0.13 < trend.slope_per_1000 < 0.30
    assert trend.baseline == pytest.approx(5e-3, rel=0.05)
    assert "per 1,000 steps" in trend.message and "in phase 'log'" in trend.message


def test_detect_trend_finds_onset():
    steps, t, phases = synth(3, n=800, growth=0.2, onset=240, phase="backward")
    trend = detect_trend(steps, t, phases)
    assert trend is not None and trend.phase == "backward"
    assert abs(trend.since_step - 240) <= 50
    # 20 % over the 560 steps after the onset = 35.7 % per 1,000 steps.
    assert trend.slope_per_1000 == pytest.approx(0.2 / 560 * 1000, rel=0.2)
    assert f"since step {trend.since_step}" in trend.message


@pytest.mark.parametrize("seed", range(20))
def test_detect_trend_no_false_alarm(seed):
    # Gaussian and heavy-tailed (Student t3) noise, 8-10 % per phase, with 3-10x spikes.
    heavy = seed % 2 == 1
    steps, t, phases = synth(100 + seed, n=[200, 500, 1500][seed % 3], heavy=heavy, noise=0.08 + 0.02 * heavy, spikes=8)
    assert detect_trend(steps, t, phases) is None


def test_detect_trend_step_change_is_a_shift():
    steps, t, phases = synth(7, n=600, jump=0.2, jump_at=400, phase="data")
    trend = detect_trend(steps, t, phases)
    assert trend is not None and trend.kind == "shift" and trend.phase == "data"
    assert abs(trend.since_step - 400) <= 10
    assert trend.change == pytest.approx(0.2, abs=0.03)
    assert "jumped" in trend.message


def test_detect_trend_ignores_small_real_growth():
    # 1 % total growth is real but below min_slowdown=3 %: not worth a finding.
    steps, t, phases = synth(1, n=2000, noise=0.01, growth=0.01, spikes=0)
    assert detect_trend(steps, t, phases) is None
    assert detect_trend(steps, t, phases, min_slowdown=0.005) is not None


def test_detect_trend_no_phase_when_growth_is_spread():
    steps, t, phases = synth(2, n=500, noise=0.05, spikes=0)
    ramp = np.linspace(0, 1, 500)
    for name in ("forward", "backward", "optimizer"):
        phases[name] = phases[name] * (1 + 0.15 * ramp)  # each grows; none explains half alone
    t = sum(phases[k] for k in BASE)
    phases["other"] = np.zeros_like(t)
    trend = detect_trend(steps, t, phases)
    assert trend is not None and trend.phase is None and "phase" not in trend.message


def test_detect_trend_short_or_decreasing_runs():
    steps, t, _ = synth(0, n=50, growth=0.5)
    assert detect_trend(steps, t) is None  # fewer than min_steps
    steps, t, _ = synth(0, n=500, growth=-0.2)  # getting faster is not a slowdown
    assert detect_trend(steps, t) is None
    t_nan = synth(0, n=500, growth=0.3)[1]
    t_nan[::3] = np.nan  # unresolved timers are skipped
    assert detect_trend(np.arange(500), t_nan) is not None


def test_detect_trend_long_run_is_binned():
    # 100,000 steps: analysed as bin medians, stays fast and still finds the growth.
    steps, t, phases = synth(4, n=100_000, growth=0.1, onset=50_000, phase="data", spikes=200)
    trend = detect_trend(steps, t, phases)
    assert trend is not None and trend.phase == "data"
    assert abs(trend.since_step - 50_000) <= 5_000
