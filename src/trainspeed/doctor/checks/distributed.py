"""Data-parallel findings: a straggling rank holds every other rank back at each collective; a
script that started its other ranks itself had only one of them measured."""

from __future__ import annotations

from typing import Any

from trainspeed.doctor.checks.context import CheckContext, ms, pct
from trainspeed.doctor.command_words import script_words
from trainspeed.doctor.findings import Finding
from trainspeed.telemetry.ranks import STRAGGLER_THRESHOLD


def _load_rise(ctx: CheckContext) -> tuple[float, str] | None:
    """(seconds the machine's load added to a step, its description) when other processes
    loaded the machine during the run (summary "contention", from rank 0's steps and the
    system sampler), else None."""
    found = ctx.summary.get("contention")
    if not isinstance(found, dict):
        return None
    quiet, loaded = found.get("wall_quiet"), found.get("wall_loaded")
    if not (isinstance(quiet, (int, float)) and isinstance(loaded, (int, float)) and loaded > quiet):
        return None
    return float(loaded - quiet), (f"steps {found.get('first_step')}-{found.get('last_step')} took "
                                   f"{ms(quiet)} -> {ms(loaded)}")


def straggler(ctx: CheckContext) -> Finding | None:
    """A rank whose own work (data + h2d + forward) or data wait is > 20 % above the other
    ranks' median, consistently (telemetry/ranks.py says when): synchronous data parallelism
    runs at the pace of the slowest rank. When other processes loaded the machine and the
    step time they added is as large as the rank's excess, the load alone explains it: a rank
    whose process lost its cores more often reads as slower, so the finding is only info."""
    rows = ctx.summary.get("ranks")
    if not isinstance(rows, list):
        return None
    slow = [r for r in rows if isinstance(r, dict) and r.get("straggler")]
    if not slow:
        return None
    worst = max(slow, key=lambda r: _excess(r) or 0.0)
    excess = _excess(worst)
    step = worst.get("step_time_p50")
    impact = min(1.0, max(0.0, excess / step)) if excess is not None and step else 0.0
    ranks = ", ".join(str(r["rank"]) for r in slow)
    data_slow = any("data wait" in str(r.get("why")) for r in slow)
    evidence = "; ".join(f"rank {r['rank']}: {r.get('why')} vs the other ranks' median (own work = data + "
                         f"h2d + forward, p50 {ms(r.get('local_p50'))}; data wait p50 {ms(r.get('data_wait_p50'))}, "
                         f"data share {pct(r.get('data_share'))})" for r in slow)
    evidence += f"; threshold {STRAGGLER_THRESHOLD:.0%}, {len(rows)} ranks"
    load = _load_rise(ctx)
    explained = load is not None and excess is not None and excess <= load[0]
    if explained:
        evidence += (f"; but other processes loaded the machine ({load[1]}, {ms(load[0])} more per step) and "
                     f"rank {worst['rank']}'s excess is {ms(excess)} per step: the load alone can explain it")
    if data_slow:
        recommendation = ("the slow rank waits for its data: give its loader more workers (data.num_workers), "
                          "check that node's disk / CPU load, or pre-process the data once")
    else:
        recommendation = ("the slow rank computes more slowly: check that node for other jobs, thermal "
                          "throttling or a slower GPU (nvidia-smi), and that per-rank batches are the same size")
    if explained:
        recommendation = "re-run the doctor on a quiet machine before acting on this; if the rank is still slow: " \
                         + recommendation
    return Finding(
        id="straggler",
        severity="info" if explained else "warning",
        title=f"Straggling rank{'s' if len(slow) > 1 else ''} {ranks}: every rank waits for it at each step"
              + (" (or the machine's load)" if explained else ""),
        evidence=evidence,
        recommendation=recommendation,
        verify_with=ctx.doctor_command() if explained and ctx.command else None,
        impact=0.0 if explained else impact,
    )


def unmeasured_ranks(ctx: CheckContext) -> Finding | None:
    """The script's process group has more ranks than the doctor ran in: the script started the
    others itself (Lightning's DDP starts them as new processes of the same command), so the
    report is one rank's, with no per-rank table or straggler check. Under torchrun the doctor
    runs in every rank: the command that does that is the one to run."""
    group = ctx.first("process_group")
    if not group or not ctx.command:
        return None
    world = int(group.get("world_size") or 1)
    measured = len(ctx.summary.get("ranks") or []) or 1
    if world <= measured:
        return None
    import shlex

    launch = f"trainspeed doctor -- torchrun --nproc_per_node {world} {shlex.join(script_words(ctx.command))}"
    framework = (ctx.first("framework") or {}).get("name")
    by = f"started by {framework} as new processes" if framework else "started by the script itself"
    return Finding(
        id="unmeasured_ranks",
        severity="info",
        title=f"Only rank {group.get('rank', 0)} of the {world} ranks was measured",
        evidence=(f"the script's process group has {world} ranks ({group.get('backend')}); the doctor ran in "
                  f"{measured} of them: the others were {by}, outside the doctor"
                  + (f"; it ended {ended} of them when it stopped this rank (they would have waited for it at "
                     "their next collective)" if (ended := (ctx.first("doctor") or {}).get("ended_ranks")) else "")),
        recommendation=("launch the ranks with torchrun so that the doctor runs in each and compares them "
                        "(per-rank step times, data waits, a straggler): Lightning, Accelerate and scripts that "
                        "call init_process_group() read torchrun's environment instead of starting their own "
                        "processes"),
        verify_with=ctx.with_pythonpath(launch),
        impact=0.0,
    )


def _excess(row: dict[str, Any]) -> float | None:
    """Seconds per step the rank spends beyond the other ranks' median (ranks.rank_table)."""
    value = row.get("excess_s")
    return float(value) if isinstance(value, (int, float)) else None


CHECKS = (straggler, unmeasured_ranks)
