"""How findings' shares of step time "at stake" are ranked, overlapped and written: one rule for
the doctor's ranking (doctor/findings.py) and the reports (report/fmt.py).

A share at stake is the part of the measured step a fix can win. Two kinds add up and two do
not: the data wait, the wait inside the host syncs and the time in logging are different stretches of the
step, so their shares add; a faster matmul precision, less padding and a fused optimizer all
shrink the same compute, so their shares overlap (fix one and the next wins less). Findings in
one OVERLAP_POOLS pool are marked as overlapping those ranked above them, and any share that
would take the counted total past 100 % is marked as overlapping everything above it, so the
shares a report adds up never exceed the step.
"""

from __future__ import annotations

from typing import Any, Iterable

SEVERITIES: tuple[str, ...] = ("critical", "warning", "info")
_RANK = {name: i for i, name in enumerate(SEVERITIES)}

SHOWN = 0.005
"""Shares below half a percent count as nothing at stake."""

OVERLAP_POOLS: dict[str, str] = {
    "fp32_on_tensor_cores": "compute",
    "padding_waste": "compute",
    "optimizer_not_fused": "compute",
    "data_parallel": "compute",
    "not_compiled": "compute",
    "compute_bound": "compute",
    "cudnn_benchmark_off": "compute",
}
"""Finding id -> the stretch of the step its share is part of, where several findings shrink
the same time. Findings not named here claim distinct measured phases."""


def impact_of(f: dict[str, Any]) -> float:
    try:
        value = float(f.get("impact") or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return value if value == value else 0.0


def rank_key(f: dict[str, Any]) -> tuple:
    """The share at stake in whole percent first (largest first), then severity, then the exact
    share, then id: a severity never lifts a finding with nothing at stake above one that can
    win time."""
    return (-round(impact_of(f), 2), _RANK.get(str(f.get("severity")), len(_RANK)), -impact_of(f),
            str(f.get("id")))


def mark_overlaps(ranked: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the ranked findings, each with "overlaps": the ids ranked above it whose time at
    stake its own share overlaps (empty when it adds to them). The shares of the findings without
    overlaps add up to at most 100 %."""
    out: list[dict[str, Any]] = []
    counted = 0.0
    for f in ranked:
        f = dict(f)
        share = impact_of(f)
        overlaps: list[str] = []
        if share >= SHOWN:
            pool = OVERLAP_POOLS.get(str(f.get("id")))
            overlaps = [str(g.get("id")) for g in out if pool and impact_of(g) >= SHOWN
                        and OVERLAP_POOLS.get(str(g.get("id"))) == pool]
            if not overlaps and counted + share > 1.0 + 1e-9:
                overlaps = [str(g.get("id")) for g in out if impact_of(g) >= SHOWN and not g.get("overlaps")]
            if not overlaps:
                counted += share
        f["overlaps"] = overlaps
        out.append(f)
    return out


def counted_total(findings: Iterable[dict[str, Any]]) -> float:
    """The sum of the shares that do not overlap others (<= 1 after mark_overlaps)."""
    return sum(impact_of(f) for f in findings if impact_of(f) >= SHOWN and not f.get("overlaps"))


def stake_text(f: dict[str, Any]) -> str:
    """"~41 % of step time at stake (basis: the wait measured; overlaps data_bound)", or "" when
    nothing is at stake."""
    share = impact_of(f)
    if share < SHOWN:
        return ""
    notes = []
    if f.get("impact_estimated"):
        notes.append("estimated")
    if f.get("basis"):
        notes.append(f"basis: {f['basis']}")
    if f.get("overlaps"):
        notes.append(f"overlaps {', '.join(f['overlaps'])}")
    return f"~{share:.0%} of step time at stake" + (f" ({'; '.join(notes)})" if notes else "")


__all__ = ["OVERLAP_POOLS", "SEVERITIES", "SHOWN", "counted_total", "impact_of", "mark_overlaps", "rank_key",
           "stake_text"]
