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


def test_the_headline_ratio_is_a_row_of_the_table_and_noise_is_not_coloured():
    # Seen: headline "B/A = 1.10 ... within the noise" over a table whose samples/s row read
    # "1.03x faster" (mean throughput), coloured as a speedup.
    import re

    from trainspeed.report.compare import RatioInterval

    a = summary(100.0, 0.0100, 0.002, 0.005, 1000.0)
    b = summary(103.0, 0.0097, 0.002, 0.004, 1000.0)
    noisy = RatioInterval(metric="samples/s", ratio=1.10, low=0.91, high=1.33, steps=(40, 40),
                          a_median=95.0, b_median=104.5)
    rows = compare_rows(a, b, noisy)
    head = headline(rows, noisy)
    said = float(re.search(r"B/A = ([0-9.]+)", head).group(1))
    assert any(r["ratio"] is not None and round(r["ratio"], 2) == said for r in rows)
    first = rows[0]
    assert first["metric"] == "samples/s, median per step" and first["a"] == 95.0 and first["verdict"] == "within the noise"
    by = {(r["group"], r["metric"]): r for r in rows}
    assert by[("throughput", "samples/s")]["verdict"] == "within the noise"  # 1.03 inside 0.83-1.21 around 1
    assert by[("step time", "p50")]["verdict"] == "within the noise"
    assert by[("phase", "forward")]["verdict"] == "1.25x faster"  # no interval of its own: read as before
    # outside the noise: read and coloured
    clear = RatioInterval(metric="samples/s", ratio=1.83, low=1.75, high=1.90, steps=(40, 40), a_median=1, b_median=2)
    rows = compare_rows(summary(100.0, 0.02, 0.01, 0.01, 1.0), summary(183.0, 0.01, 0.01, 0.01, 1.0), clear)
    assert rows[0]["verdict"] == "1.83x faster" and rows[1]["verdict"] == "1.83x faster"
