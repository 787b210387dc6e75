"""The per-rank table of a data-parallel run (summary["ranks"]), as text cells shared by the
terminal and HTML reports."""

from __future__ import annotations

from typing import Any

from trainspeed.report.fmt import fmt_ms, fmt_share

HEADERS = ("rank", "steps", "step p50", "own work p50", "data wait p50", "data share", "straggler")
"""own work: data + h2d + forward, the part each rank does before waiting for the others."""


def rank_rows(summary: dict[str, Any] | None) -> list[tuple[str, ...]]:
    """One row of cells per rank; empty for a single-process run."""
    rows = (summary or {}).get("ranks")
    if not isinstance(rows, list):
        return []
    out = []
    for r in rows:
        if not isinstance(r, dict):
            continue
        flag = f"YES: {r.get('why')}" if r.get("straggler") else "no"
        out.append((str(r.get("rank")), str(r.get("steps")), fmt_ms(r.get("step_time_p50")),
                    fmt_ms(r.get("local_p50")), fmt_ms(r.get("data_wait_p50")),
                    fmt_share(r.get("data_share")), flag))
    return out
