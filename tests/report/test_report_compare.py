from __future__ import annotations

import pytest

from trainspeed.report.compare import compare_rows, fmt_value, headline

pytestmark = pytest.mark.timeout(30)


def summary(rate, p50, data, fwd, rss):
    return {"samples_per_s": rate, "tokens_per_s": None,
            "step_time": {"p50": p50, "p90": p50 * 1.1, "p99": p50 * 1.2, "mean": p50},
            "phases": {"data": {"mean_s": data, "share": 0.5}, "forward": {"mean_s": fwd, "share": 0.5},
                       "ckpt": {"mean_s": 0.0, "share": 0.0}},
            "memory": {"rss_peak": rss, "cuda_alloc_peak": None}}


def test_rows_ratios_and_readings():
    a = summary(100.0, 0.02, 0.010, 0.010, 1000.0)
    b = summary(183.0, 0.01, 0.001, 0.010, 2000.0)
    rows = {(r["group"], r["metric"]): r for r in compare_rows(a, b)}
    assert rows[("throughput", "samples/s")]["verdict"] == "1.83x faster"
    assert rows[("throughput", "samples/s")]["ratio"] == pytest.approx(1.83)
    assert rows[("step time", "p50")]["ratio"] == pytest.approx(0.5)
    assert rows[("step time", "p50")]["verdict"] == "2.00x faster"
    assert rows[("phase", "data")]["verdict"] == "10.00x faster"
    assert rows[("phase", "forward")]["verdict"] == "same"
    assert rows[("memory", "host RSS peak")]["verdict"] == "2.00x more"
    assert ("phase", "ckpt") not in rows  # no time in either run
    assert ("memory", "device allocated peak") not in rows
    assert ("throughput", "tokens/s") not in rows
    assert headline(list(rows.values())) == "B is 1.83x faster than A (throughput samples/s, B/A = 1.83)"


def test_missing_values_give_dashes():
    rows = compare_rows({}, {"samples_per_s": 5.0})
    assert rows[0]["ratio"] is None and rows[0]["verdict"] == "—"
    assert fmt_value(None, "seconds") == "—"
    assert fmt_value(0.0123, "seconds") == "12.30 ms"
    assert fmt_value(2**20, "bytes") == "1.0 MiB"
