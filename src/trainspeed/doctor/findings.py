"""The Finding: one diagnosed problem, with its evidence and the concrete change that fixes it.

A finding is written to report.json as a plain dict (see the shared contract):

    {"id": "data_bound", "severity": "critical"|"warning"|"info", "title": str,
     "evidence": str, "recommendation": str, "verify_with": str|None, "impact": float}

`impact` is the fraction of step time at stake (0..1), measured or, where `impact_estimated`
is true, estimated (the estimate is labelled as such in reports). Findings are ranked by the
time at stake first (in whole percent; severity breaks ties, then the exact impact), so the
first line of a report is the thing that wins the most time, and a finding with nothing at
stake (a busy machine, host syncs on a CPU) is never above one with real time at stake.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from trainspeed.errors import ConfigError
from trainspeed.telemetry.stakes import SEVERITIES, mark_overlaps, rank_key, stake_text

_RANK = {name: i for i, name in enumerate(SEVERITIES)}


@dataclass(kw_only=True, slots=True)
class Finding:
    id: str
    """Stable identifier of the rule that fired (e.g. "data_bound"); tests and tools key on it."""
    severity: str
    """One of SEVERITIES."""
    title: str
    """One line: what is wrong."""
    evidence: str
    """The measured numbers that show it (shares, counts, call sites)."""
    recommendation: str
    """The concrete change: an engine switch (`data.num_workers=4`) or the user's code line."""
    verify_with: str | None = None
    """A command that measures the fix (`trainspeed tune ... --knobs ...`), when one exists."""
    impact: float = 0.0
    """Fraction of step time at stake, 0..1: the first ranking key."""
    impact_estimated: bool = False
    """True when `impact` is an estimate (what a sync would cost on a GPU, a projection), not a
    share measured in this run."""
    basis: str = ""
    """How `impact` was obtained from this run ("the data wait measured", "matmul share 62 % x
    (1 - fp32/bf16 peak 0.07)"): never a constant, and the report prints it."""
    overlaps: list[str] = field(default_factory=list)
    """Ids of findings ranked above whose time at stake this one's overlaps (set by rank())."""
    verify_impact: float | None = None
    """The share of the step the verify command's setting can remove, where that is less than
    `impact` (padding: a script's --pad_to_max_length removes only the positions past each
    batch's longest sample). The tune's "at stake" column and knob order use it."""
    advises: dict[str, str] = field(default_factory=dict)
    """The tune knob settings the recommendation advises, named as the tune names them
    ({"num_workers": "1"}; "*" for the knob at all, whatever its setting: {"compile": "*"}): where
    a tune of the script measured one as no gain, its measurement replaces the advice
    (doctor/tuned.py) by `otherwise`."""
    otherwise: str = ""
    """The recommendation when a tune measured what `advises` names as no gain."""

    def __post_init__(self) -> None:
        if self.severity not in _RANK:
            raise ConfigError(
                f"Finding.severity must be one of {', '.join(SEVERITIES)}, got {self.severity!r}"
            )
        if not self.id:
            raise ConfigError("Finding.id must be a non-empty string")
        impact = float(self.impact)
        if impact != impact:  # NaN: unknown impact ranks last within its severity
            impact = 0.0
        self.impact = min(1.0, max(0.0, impact))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rank(findings: Iterable[Finding | dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings as dicts, sorted by the share of step time at stake in whole percent (largest
    first; below half a percent counts as nothing), then severity (critical first), then the
    exact impact, then id (so equal findings keep a deterministic order). A severity never
    lifts a finding with nothing at stake above one that can win time. Each carries
    "overlaps" (telemetry/stakes.py): shares that overlap say so, and the others add up to at
    most 100 %."""
    dicts = [f.to_dict() if isinstance(f, Finding) else dict(f) for f in findings]
    return mark_overlaps(sorted(dicts, key=rank_key))


def verify_knobs(finding: dict[str, Any]) -> list[str]:
    """The knobs a finding's `trainspeed tune --knobs a,b -- ...` verify command names (none for
    another verify command): what the tune measures for it, and what it reports back."""
    import re

    m = re.search(r"--knobs\s+([\w,]+)", str(finding.get("verify_with") or ""))
    return m.group(1).split(",") if m else []


def format_findings(findings: list[dict[str, Any]], *, limit: int | None = None) -> str:
    """A short ranked plain-text list (used when the report renderer is not available)."""
    if not findings:
        return "No problems found: nothing costs a measurable share of the step time."
    lines = []
    shown = findings if limit is None else findings[:limit]
    for i, f in enumerate(shown, start=1):
        stake = stake_text(f)
        at_stake = f" — {stake}" if stake else ""
        lines.append(f"{i}. [{f.get('severity', '?').upper()}] {f.get('title')}{at_stake}")
        lines.append(f"   evidence: {f.get('evidence')}")
        lines.append(f"   fix:      {f.get('recommendation')}")
        if f.get("verify_with"):
            lines.append(f"   verify:   {f['verify_with']}")
        if f.get("tuned"):
            lines.append(f"   tuned:    {f['tuned']}")
    if limit is not None and len(findings) > limit:
        lines.append(f"... and {len(findings) - limit} more in report.json")
    return "\n".join(lines)
