from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from trainspeed.report import series as S

pytestmark = pytest.mark.timeout(30)


def fake_run(steps):
    return SimpleNamespace(steps=steps, path=Path("/x/run"))


def test_column_reads_nested_and_missing_as_nan():
    run = fake_run([{"step": 0, "mem": {"rss": 5}}, {"step": 1, "mem": {"rss": None}}, {"step": 2}, {"step": 3, "mem": 7}])
    np.testing.assert_array_equal(S.column(run, "mem.rss"), [5.0, np.nan, np.nan, np.nan])
    assert not S.has_data(S.column(run, "loss"))
    np.testing.assert_array_equal(S.first_column(run, ("mem.nope", "mem.rss"))[:1], [5.0])


def test_step_axis_fills_missing_steps():
    run = fake_run([{"step": 10}, {}, {"step": 12}])
    np.testing.assert_array_equal(S.step_axis(run), [10.0, 1.0, 12.0])


def test_rolling_median_trailing_and_nan_aware():
    y = np.array([1.0, 100.0, 3.0, np.nan, 5.0])
    np.testing.assert_allclose(S.rolling_median(y, 3), [1.0, 50.5, 3.0, 51.5, 4.0])
    assert S.rolling_median(np.array([]), 5).size == 0


def test_bin_slices_cover_everything_once():
    slices = S.bin_slices(103, 10)
    assert len(slices) == 10
    covered = np.concatenate([np.arange(103)[s] for s in slices])
    np.testing.assert_array_equal(covered, np.arange(103))
    assert len(S.bin_slices(5, 60)) == 5


def test_throughput_is_ratio_of_sums_and_skips_warmup():
    steps = [{"step": 0, "t_step": 10.0, "samples": 1, "warmup": True}]
    steps += [{"step": i, "t_step": t, "samples": 10} for i, t in zip(range(1, 5), (1.0, 1.0, 1.0, 7.0))]
    x, rate, unit = S.throughput_series(fake_run(steps), max_bins=1)
    assert unit == "samples/s"
    np.testing.assert_allclose(rate, [40.0 / 10.0])  # not the mean of per-step rates (7.86)
    np.testing.assert_allclose(x, [2.5])


def test_throughput_prefers_tokens():
    steps = [{"step": i, "t_step": 0.5, "samples": 2, "tokens": 100} for i in range(4)]
    _, rate, unit = S.throughput_series(fake_run(steps), max_bins=2)
    assert unit == "tokens/s"
    np.testing.assert_allclose(rate, [200.0, 200.0])


def test_trend_line_fits_after_change_point():
    x = np.arange(100.0)
    y = np.where(x < 60, 1.0, 1.0 + 0.5 * (x - 60))
    xs, ys = S.trend_line(x, y, 60)
    np.testing.assert_allclose(xs, [60, 99])
    np.testing.assert_allclose(ys, [1.0, 1.0 + 0.5 * 39], atol=1e-9)
    assert S.trend_line(x[:1], y[:1], 0) is None


def test_phase_bins_drop_empty_phases():
    steps = [{"step": i, "phases": {"data": 0.1, "forward": 0.2 + 0.01 * i, "ckpt": 0.0}} for i in range(10)]
    centers, means = S.phase_bins(fake_run(steps), max_bins=2)
    assert set(means) == {"data", "forward"}
    np.testing.assert_allclose(centers, [2.0, 7.0])
    np.testing.assert_allclose(means["forward"], [0.22, 0.27])
