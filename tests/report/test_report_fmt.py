from __future__ import annotations

import math

import pytest

from trainspeed.report.fmt import (
    fmt_bytes,
    fmt_ms,
    fmt_rate,
    fmt_seconds,
    mfu_text,
    rank_findings,
    ratio,
    verdict,
)

pytestmark = pytest.mark.timeout(30)


def test_fmt_seconds_picks_unit():
    assert fmt_seconds(0.0123) == "12.3 ms"
    assert fmt_seconds(2.5) == "2.50 s"
    assert fmt_seconds(3.2e-5) == "32.0 us"
    assert fmt_seconds(None) == "—"
    assert fmt_seconds(float("nan")) == "—"


def test_fmt_ms_bytes_rate():
    assert fmt_ms(0.01234) == "12.34"
    assert fmt_ms(0.0004) == "0.400"
    assert fmt_bytes(1536) == "1.5 KiB"
    assert fmt_bytes(3 * 2**30) == "3.0 GiB"
    assert fmt_bytes(None) == "—"
    assert fmt_rate(12345.6, "samples/s") == "12.3k samples/s"
    assert fmt_rate(2.5e6, "tokens/s") == "2.5M tokens/s"
    assert fmt_rate(42.0, "samples/s") == "42 samples/s"


def test_mfu_text_names_peak_or_says_why_not():
    ok = {"value": 0.423, "valid": True, "peak_name": "H100 SXM bf16", "peak_flops": 989e12, "note": None}
    assert mfu_text(ok) == "42.3% of peak (H100 SXM bf16, 989 TFLOP/s)"
    bad = {"value": 1.7, "valid": False, "peak_name": "x", "peak_flops": 1e12, "note": "MFU > 100%: FLOPs overcounted"}
    assert mfu_text(bad) == "invalid: MFU > 100%: FLOPs overcounted"
    assert "170" not in mfu_text(bad)  # an invalid figure is never printed as a result
    assert mfu_text(None) == "not measured"
    assert mfu_text({"value": None, "valid": False, "note": "peak unknown"}) == "not measured (peak unknown)"


def test_rank_findings_share_at_stake_then_severity():
    """The doctor's order (report.json is ranked so): the share at stake first; a severity
    never lifts a finding with nothing at stake above one that can win time."""
    fs = [
        {"id": "a", "severity": "info", "impact": 0.9},
        {"id": "b", "severity": "warning", "impact": 0.1},
        {"id": "c", "severity": "critical", "impact": 0.2},
        {"id": "d", "severity": "warning", "impact": 0.5},
        {"id": "e", "severity": "critical", "impact": None},
        "not a dict",
    ]
    assert [f["id"] for f in rank_findings(fs)] == ["a", "d", "c", "b", "e"]
    assert rank_findings(None) == []


def test_ratio_and_verdict():
    assert ratio(100.0, 183.0) == pytest.approx(1.83)
    assert ratio(0, 1.0) is None and ratio(None, 1.0) is None
    assert verdict(1.83, higher_is_better=True) == "1.83x faster"
    assert verdict(0.5, higher_is_better=True) == "2.00x slower"
    assert verdict(0.5, higher_is_better=False) == "2.00x faster"  # time halved
    assert verdict(2.0, higher_is_better=False, noun=("less", "more")) == "2.00x more"
    assert verdict(1.001, higher_is_better=True) == "same"
    assert verdict(None, higher_is_better=True) == "—"
    assert not math.isnan(ratio(3.0, 6.0))
