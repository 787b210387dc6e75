"""Side-by-side comparison of two runs' summaries: pure rows, rendered by terminal and HTML.

Every row carries A's and B's value, the ratio B/A, and the ratio read as words
("1.83x faster"), with the direction that is better for that metric.
"""

from __future__ import annotations

from typing import Any

from trainspeed.report.fmt import fmt_bytes, fmt_ms, fmt_rate, is_num, ratio, verdict
from trainspeed.telemetry.schema import PHASES

MEMORY_KEYS = (
    ("cuda_alloc_peak", "device allocated peak"),
    ("cuda_reserved_peak", "device reserved peak"),
    ("rss_peak", "host RSS peak"),
    ("worker_rss_peak", "workers RSS peak"),
)


def _row(group: str, metric: str, a: Any, b: Any, kind: str, *, higher_is_better: bool) -> dict[str, Any]:
    r = ratio(a, b)
    noun = ("less", "more") if kind == "bytes" else ("faster", "slower")
    return {
        "group": group,
        "metric": metric,
        "a": a if is_num(a) else None,
        "b": b if is_num(b) else None,
        "kind": kind,
        "ratio": r,
        "verdict": verdict(r, higher_is_better=higher_is_better, noun=noun),
    }


def compare_rows(sa: dict[str, Any], sb: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for throughput, step time, each phase with time in either run, and memory peaks."""
    rows = [
        _row("throughput", "samples/s", sa.get("samples_per_s"), sb.get("samples_per_s"), "rate", higher_is_better=True),
    ]
    if is_num(sa.get("tokens_per_s")) or is_num(sb.get("tokens_per_s")):
        rows.append(_row("throughput", "tokens/s", sa.get("tokens_per_s"), sb.get("tokens_per_s"), "rate",
                         higher_is_better=True))
    sta, stb = sa.get("step_time") or {}, sb.get("step_time") or {}
    for q in ("p50", "p90", "p99"):
        rows.append(_row("step time", q, sta.get(q), stb.get(q), "seconds", higher_is_better=False))
    pa, pb = sa.get("phases") or {}, sb.get("phases") or {}
    for phase in PHASES:
        a = (pa.get(phase) or {}).get("mean_s")
        b = (pb.get(phase) or {}).get("mean_s")
        if (is_num(a) and a > 0) or (is_num(b) and b > 0):
            rows.append(_row("phase", phase, a, b, "seconds", higher_is_better=False))
    ma, mb = sa.get("memory") or {}, sb.get("memory") or {}
    for key, label in MEMORY_KEYS:
        if is_num(ma.get(key)) or is_num(mb.get(key)):
            rows.append(_row("memory", label, ma.get(key), mb.get(key), "bytes", higher_is_better=False))
    return rows


def fmt_value(value: Any, kind: str) -> str:
    if kind == "seconds":
        return f"{fmt_ms(value)} ms" if is_num(value) else "—"
    if kind == "bytes":
        return fmt_bytes(value)
    if kind == "rate":
        return fmt_rate(value, "").strip() if is_num(value) else "—"
    return str(value) if value is not None else "—"


def headline(rows: list[dict[str, Any]]) -> str | None:
    """One sentence for the top of a comparison, from the most informative throughput row."""
    best = next((r for r in rows if r["group"] == "throughput" and r["metric"] == "tokens/s" and r["ratio"]), None)
    best = best or next((r for r in rows if r["group"] == "throughput" and r["ratio"]), None)
    best = best or next((r for r in rows if r["group"] == "step time" and r["metric"] == "p50" and r["ratio"]), None)
    if best is None:
        return None
    words = "as fast as" if best["verdict"] == "same" else f"{best['verdict']} than"
    return f"B is {words} A ({best['group']} {best['metric']}, B/A = {best['ratio']:.2f})"
