"""The doctor's predicted stakes, per knob: what the tune measures first and shows beside
its measured gain.

A doctor finding names the tune that measures it (`verify: trainspeed tune --knobs
num_workers -- ...`) and the share of the step time at stake (`impact`, from the run's own
measurements). The tune orders its knobs by those shares and writes each knob's share in the
table's "at stake" column: on the H100 the doctor put ~40 % of the step in data loading and
~40 % in fp32, and the tune of the same script crowned nothing, with no figure side by side.
"""

from __future__ import annotations

from typing import Any, Sequence

from trainspeed.tune.result import Row
from trainspeed.tune.script_knobs import knobs_from_findings


def _impact(finding: dict[str, Any]) -> float:
    """The share the finding's tune can remove: its verify_impact where the doctor measured a
    smaller one for the setting the tune varies, else the finding's whole share."""
    value = finding.get("verify_impact")
    if not isinstance(value, (int, float)) or value != value:
        value = finding.get("impact")
    return float(value) if isinstance(value, (int, float)) and value == value else 0.0


def stakes_by_knob(findings: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Knob -> the largest share at stake among the findings that name it."""
    out: dict[str, float] = {}
    for f in findings:
        for knob in knobs_from_findings([f]):
            out[knob] = max(out.get(knob, 0.0), _impact(f))
    return out


def order_by_stake(knobs: list[str], findings: Sequence[dict[str, Any]]) -> list[str]:
    """The knobs whose findings put time at stake first, largest stake first (rank order on
    ties), then the rest in their order: a finding with nothing measured at stake ('the model is
    not compiled') does not send a costly setting ahead (nanoGPT's compile trial took 396 s of a
    6m budget on a loaded machine, first because a finding named it)."""
    named = ahead_by_stake(knobs, findings)
    return named + [k for k in knobs if k not in named]


def ahead_by_stake(knobs: list[str], findings: Sequence[dict[str, Any]]) -> list[str]:
    """The knobs order_by_stake moves to the front, in that order."""
    stakes = stakes_by_knob(findings)
    unknown = {k for k in knobs_from_findings([f for f in findings if f.get("impact") is None])}
    named = [k for k in knobs_from_findings(list(findings)) if k in knobs and (stakes.get(k, 0.0) > 0 or k in unknown)]
    named.sort(key=lambda k: -stakes.get(k, 0.0))  # stable: the doctor's rank breaks ties
    return named


def order_line(knobs: list[str], findings: Sequence[dict[str, Any]], source: str) -> str:
    """What the console says of the order: the knobs measured first, only those the findings
    put time at stake on. makemore's and word_language_model's tunes said "the baseline's
    findings name compile: measured first" of a finding with nothing at stake, and measured
    compile last, or not at all."""
    named = [k for k in knobs_from_findings(list(findings)) if k in knobs]
    first = ahead_by_stake(knobs, findings)
    if not named:
        return f"{source} name no knob"
    if not first:
        return f"{source} name {', '.join(named)}, with no share of the step at stake: the usual order"
    rest = [k for k in named if k not in first]
    return (f"{source} put time at stake on {', '.join(first)}: measured first"
            + (f" ({', '.join(rest)}: nothing at stake, the usual place)" if rest else ""))


def mark_stakes(rows: Sequence[Row], findings: Sequence[dict[str, Any]]) -> None:
    """Each row of a knob a finding names carries that finding's share at stake."""
    stakes = stakes_by_knob(findings)
    for row in rows:
        if row.knob in stakes and stakes[row.knob] > 0:
            row.stake = stakes[row.knob]


__all__ = ["ahead_by_stake", "mark_stakes", "order_by_stake", "order_line", "stakes_by_knob"]
