"""Data-parallel findings: a straggling rank holds every other rank back at each collective."""

from __future__ import annotations

from trainspeed.doctor.checks.context import CheckContext, ms, pct
from trainspeed.doctor.findings import Finding
from trainspeed.telemetry.ranks import STRAGGLER_THRESHOLD


def straggler(ctx: CheckContext) -> Finding | None:
    """A rank whose own work (data + h2d + forward) or data wait is > 20 % above the other
    ranks' median: synchronous data parallelism runs at the pace of the slowest rank."""
    rows = ctx.summary.get("ranks")
    if not isinstance(rows, list):
        return None
    slow = [r for r in rows if isinstance(r, dict) and r.get("straggler")]
    if not slow:
        return None
    local = sorted(r["local_p50"] for r in rows if isinstance(r.get("local_p50"), (int, float)))
    med = local[len(local) // 2] if local else None
    worst = max(slow, key=lambda r: r.get("local_p50") or 0.0)
    excess = ((worst.get("local_p50") or 0.0) - med) if med is not None else None
    step = worst.get("step_time_p50")
    impact = min(1.0, max(0.0, excess / step)) if excess is not None and step else 0.0
    ranks = ", ".join(str(r["rank"]) for r in slow)
    data_slow = any("data wait" in str(r.get("why")) for r in slow)
    evidence = "; ".join(f"rank {r['rank']}: {r.get('why')} vs the other ranks' median (own work = data + "
                         f"h2d + forward, p50 {ms(r.get('local_p50'))}; data wait p50 {ms(r.get('data_wait_p50'))}, "
                         f"data share {pct(r.get('data_share'))})" for r in slow)
    evidence += f"; threshold {STRAGGLER_THRESHOLD:.0%}, {len(rows)} ranks"
    if data_slow:
        recommendation = ("the slow rank waits for its data: give its loader more workers (data.num_workers), "
                          "check that node's disk / CPU load, or pre-process the data once")
    else:
        recommendation = ("the slow rank computes more slowly: check that node for other jobs, thermal "
                          "throttling or a slower GPU (nvidia-smi), and that per-rank batches are the same size")
    return Finding(
        id="straggler",
        severity="warning",
        title=f"Straggling rank{'s' if len(slow) > 1 else ''} {ranks}: every rank waits for it at each step",
        evidence=evidence,
        recommendation=recommendation,
        impact=impact,
    )


CHECKS = (straggler,)
