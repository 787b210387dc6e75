from __future__ import annotations

import math

import numpy as np
import pytest

from trainspeed.errors import ConfigError
from trainspeed.telemetry.throughput import mfu, percentiles, throughput

pytestmark = pytest.mark.timeout(30)


def test_percentiles_hand_computed():
    # 1..101: linear-interpolated percentiles land exactly on integers.
    x = np.arange(1, 102, dtype=float)
    assert percentiles(x) == {"p50": 51.0, "p90": 91.0, "p99": 100.0}


def test_percentiles_ignore_nan_and_empty():
    assert percentiles(np.array([np.nan, 1.0, 3.0, np.inf]), qs=(50,)) == {"p50": 2.0}
    assert percentiles(np.array([])) == {}
    assert percentiles(np.array([np.nan])) == {}
    assert percentiles([2.0, 4.0], qs=(50, 99.9)) == {"p50": 3.0, "p99.9": pytest.approx(3.998)}


def test_throughput_excludes_warmup_steps():
    # Step 0 is a 2 s compile step; it must not enter the figures.
    t = np.array([2.0, 0.1, 0.1, 0.2])
    samples = np.array([32, 32, 32, 32])
    tokens = np.array([1000, 1000, 2000, 1000])
    stats = throughput(t, samples, tokens, exclude=np.array([True, False, False, False]))
    assert stats.steps == 3
    assert stats.seconds == pytest.approx(0.4)
    assert stats.samples_per_s == pytest.approx(96 / 0.4)  # 240
    assert stats.tokens_per_s == pytest.approx(4000 / 0.4)  # 10000
    assert stats.step_time_p50 == pytest.approx(0.1)
    assert stats.step_time_mean == pytest.approx(0.4 / 3)
    # Without the mask the compile step dominates.
    assert throughput(t, samples).samples_per_s == pytest.approx(128 / 2.4)


def test_throughput_scalar_samples_and_no_tokens():
    stats = throughput([0.5, 0.5], 10)
    assert stats.samples_per_s == pytest.approx(20.0)
    assert stats.tokens_per_s is None
    assert stats.as_dict()["steps"] == 2


def test_throughput_drops_unresolved_steps_with_their_samples():
    stats = throughput([0.5, np.nan, 0.5], [10, 1000, 10])
    assert stats.steps == 2
    assert stats.samples_per_s == pytest.approx(20.0)


def test_throughput_everything_excluded():
    stats = throughput([1.0], [1], exclude=[True])
    assert stats.steps == 0 and stats.samples_per_s is None and stats.step_time_p50 is None


def test_throughput_length_mismatch_is_an_error():
    with pytest.raises(ConfigError, match="samples has 3 entries"):
        throughput([1.0, 2.0], [1, 2, 3])
    with pytest.raises(ConfigError, match="exclude"):
        throughput([1.0, 2.0], 1, exclude=[True])


def test_mfu_hand_computed():
    # 3e12 FLOPs in 0.1 s = 3e13 FLOP/s against a 1e14 peak = 30 %.
    r = mfu(3e12, 0.1, 1e14, "fake bf16")
    assert r.valid and r.value == pytest.approx(0.3) and r.note == ""
    assert r.peak_name == "fake bf16"


def test_mfu_above_one_is_a_measurement_error():
    r = mfu(2e13, 0.1, 1e14, "fake bf16")
    assert r.value == pytest.approx(2.0)
    assert not r.valid
    assert "measurement error" in r.note and "200 %" in r.note


@pytest.mark.parametrize(
    "args, note",
    [((None, 0.1, 1e14), "FLOPs"), ((1e12, 0.1, None), "peak"), ((1e12, math.nan, 1e14), "step time"), ((1e12, 0.0, 1e14), "step time")],
)
def test_mfu_missing_inputs(args, note):
    r = mfu(*args)
    assert r.value is None and not r.valid and note in r.note
