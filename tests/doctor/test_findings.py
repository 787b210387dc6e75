from __future__ import annotations

import pytest

from trainspeed.doctor.findings import Finding, format_findings, rank
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


def _f(id_, severity, impact):
    return Finding(id=id_, severity=severity, title=id_, evidence="e", recommendation="r", impact=impact)


def test_rank_orders_by_time_at_stake_then_severity():
    ranked = rank([_f("a", "info", 0.9), _f("b", "warning", 0.1), _f("c", "critical", 0.05),
                   _f("d", "warning", 0.4)])
    assert [f["id"] for f in ranked] == ["a", "d", "b", "c"]
    # equal time at stake (whole percent): severity decides
    ranked = rank([_f("x", "info", 0.2), _f("y", "critical", 0.2), _f("z", "warning", 0.201)])
    assert [f["id"] for f in ranked] == ["y", "z", "x"]


def test_nothing_at_stake_never_ranks_above_real_time():
    ranked = rank([_f("contention", "critical", 0.0), _f("syncs", "warning", 0.001), _f("ckpt", "info", 0.3),
                   _f("log", "warning", 0.05)])
    assert [f["id"] for f in ranked] == ["ckpt", "log", "contention", "syncs"]


def test_estimated_impact_is_labelled():
    f = Finding(id="s", severity="info", title="t", evidence="e", recommendation="r", impact=0.05,
                impact_estimated=True)
    assert "~5% of step time at stake (estimated)" in format_findings(rank([f]))


def test_impact_is_clamped_and_nan_ranks_last():
    assert _f("a", "info", 3.0).impact == 1.0
    assert _f("a", "info", -1).impact == 0.0
    assert _f("a", "info", float("nan")).impact == 0.0


def test_invalid_severity_is_a_config_error():
    with pytest.raises(ConfigError, match="severity"):
        _f("a", "fatal", 0.1)


def test_format_lists_findings_in_order_with_fix():
    text = format_findings(rank([_f("x", "warning", 0.25), _f("y", "critical", 0.5)]))
    assert text.index("[CRITICAL] y") < text.index("[WARNING] x")
    assert "~50% of step time" in text and "fix:" in text
    assert "No problems found" in format_findings([])
