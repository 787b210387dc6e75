"""Findings about the machine the run shared: other processes' load through the whole run.

machine_contention (loop.py) finds steps that got slower when other processes started; a run
that was loaded from its first measured step to its last shows no such change, yet every time
it reports is inflated. On 2 shared cores where other jobs used 1.6 of them, karpathy/minGPT's
chargpt (gpt-nano, batch 16) read 700 ms per step under the doctor and its 500-token sample
took 20 s with torch's 2 compute threads against 1 s with one: threads that wait for a
descheduled sibling spin. The doctor said nothing, and the figures read as the script's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainspeed.doctor.checks.context import CheckContext, ms
from trainspeed.doctor.findings import Finding
from trainspeed.telemetry.gpu_busy import busy_window
from trainspeed.telemetry.summary import system_series

BUSY_MIN_CORES = 0.5
"""Other processes' median CPU over the measured steps, in cores, from which the run counts as
run on a busy machine (and at least BUSY_MIN_SHARE of the cores): a shared machine is never
idle, but half a core taken all the time is a visible share of a small VM."""
BUSY_MIN_SHARE = 0.25
BUSY_WARNING_SHARE = 0.5
"""Half the machine's cores or more taken by others: the run's figures are far off; a warning."""
MACHINE_FINDINGS = ("machine_contention", "machine_busy")
"""Ids of the findings about the machine the run shared, not the script: other processes' load,
with nothing at stake and "(not the script)" in the title. A verdict about the script (its first
finding, its warnings) is read from the other findings, which that load cannot add."""
ROOM_SLACK = 0.15
"""Cores by which others' reading may exceed what this process left before it is read as taken
outside the measured steps (the two clocks are read over slightly different windows)."""
SPIN_MIN = 2.0
"""CPU time per step at least doubled under other processes' load, with 2+ compute threads:
threads spinning while they wait for descheduled siblings (work done alone does not double)."""


def usable_cores(ctx: CheckContext) -> int:
    """The cores this run could use (affinity, else logical cores, else the context's count)."""
    cpu = (ctx.run.env or {}).get("cpu") or {}
    return int(cpu.get("available_cores") or cpu.get("logical_cores") or ctx.cores or 1)


def torch_threads(ctx: CheckContext) -> int | None:
    value = ((ctx.run.env or {}).get("cpu") or {}).get("torch_threads")
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def _readings(ctx: CheckContext, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(the system sampler's finite readings of series `name` while the measured steps ran,
    warm-up excluded, their wall-clock span as the GPU busy figure reads it; all its finite
    readings); None without samples."""
    series = system_series(ctx.run)
    t, values = series.get("t"), series.get(name)
    if t is None or values is None or t.size == 0 or t.size != values.size:
        return None
    window = busy_window(ctx.run.array("t_wall"), ctx.run.array("t_step"), ~(ctx.run.array("warmup") > 0.5))
    if window is None:
        return None
    start, stop = window
    return values[(t >= start) & (t <= stop) & np.isfinite(values)], values[np.isfinite(values)]


def others_during_measured_steps(ctx: CheckContext) -> tuple[float, str] | None:
    """(other processes' median CPU in % of one core, the window it was read over) from the
    system samples taken while the measured steps (warm-up excluded) ran; None without samples.
    Measured steps shorter than a few sampler intervals (chargpt's 100 steps of 7 ms on a
    loaded CI machine held 2 readings) are judged on every reading the run took instead: the
    load through the whole run is what this finding is about."""
    read = _readings(ctx, "cpu_others")
    if read is None:
        return None
    inside, whole = read
    if inside.size >= 3:
        return float(np.median(inside)), "while the measured steps ran"
    if whole.size >= 2:
        return float(np.median(whole)), "while the run ran"
    return None


def busy_machine(ctx: CheckContext, others: float | None = None) -> dict[str, Any] | None:
    """{others (cores), cores, share, got (cores this process had), threads, window (when the
    load was read)} when other processes held the machine's cores through the measured steps
    (or `others`, % of one core, read by the caller), else None."""
    window = "while the quiet steps ran"
    own_reading = others is None
    if others is None:
        read = others_during_measured_steps(ctx)
        if read is None:
            return None
        others, window = read
    cores = usable_cores(ctx)
    taken = others / 100.0
    cpu, wall = ctx.summary.get("cpu_per_step"), ctx.step_mean
    got = float(cpu) / wall if isinstance(cpu, (int, float)) and wall else None
    if own_reading and got is not None and taken > cores - got + ROOM_SLACK:
        # Others cannot have used more than the cores this process left while its steps ran:
        # nanoGPT's 55 steps of 9.5 ms held no sampler reading, the whole run's (a neighbour
        # that left before them) read 1.0 core beside this process's measured 1.70 of 2.
        taken = max(0.0, cores - got)
        window = (f"at most, while the measured steps ran (this process used the rest; the sampler's median "
                  f"{window} was {others / 100:.1f})")
    if taken < BUSY_MIN_CORES or taken < BUSY_MIN_SHARE * cores:
        return None
    return {"others": taken, "cores": cores, "share": taken / cores, "got": got, "threads": torch_threads(ctx),
            "window": window}


def workers_cpu_per_step(ctx: CheckContext) -> float | None:
    """CPU seconds per measured step that this process's children (DataLoader workers) used:
    the process tree's CPU while the measured steps ran (system sampler, cpu_tree) less this
    process's own (its CPU time per step over their wall time); None without samples."""
    read = _readings(ctx, "cpu_tree")
    keep = ~(ctx.run.array("warmup") > 0.5)
    wall, cpu = ctx.run.array("t_step")[keep], ctx.run.array("cpu")[keep]
    ok = np.isfinite(wall) & np.isfinite(cpu)
    if read is None or read[0].size < 3 or not ok.any() or wall[ok].sum() <= 0:
        return None
    own = float(cpu[ok].sum() / wall[ok].sum())  # cores
    return max(0.0, float(np.mean(read[0])) / 100.0 - own) * float(np.mean(wall[ok]))


def got_text(found: dict[str, Any], ctx: CheckContext) -> str:
    """'; this process got 0.22 cores with 2 compute threads (CPU time 251 ms per 1120 ms step)'."""
    cpu, wall = ctx.summary.get("cpu_per_step"), ctx.step_mean
    if found.get("got") is None or not wall:
        return ""
    threads = f" with {found['threads']} compute threads" if found.get("threads") else ""
    return f"; this process got {found['got']:.2f} cores{threads} (CPU time {ms(float(cpu))} per {ms(wall)} step)"


def threads_advice(ctx: CheckContext, found: dict[str, Any]) -> str:
    """While the cores stay shared: fewer compute threads, measured by the script tune."""
    threads = found.get("threads")
    if not threads or threads < 2:
        return ""
    command = ctx.tune_command("threads") if ctx.command else None
    how = f" (`{command}` measures it on this machine)" if command else ""
    return (f". While the cores stay shared, fewer compute threads than the {threads} torch uses may be faster: "
            f"a thread that waits for a descheduled sibling spins{how}")


def machine_busy(ctx: CheckContext) -> Finding | None:
    """Other processes held the cores through the whole run (no change for machine_contention
    to find): nothing in the script is at fault, so nothing is at stake, but every time the
    report shows is pessimistic, and the user must know before acting on it."""
    if ctx.summary.get("contention"):
        return None  # machine_contention says it, with the quiet steps' load (loop.py)
    found = busy_machine(ctx)
    if found is None:
        return None
    return Finding(
        id="machine_busy",
        severity="warning" if found["share"] >= BUSY_WARNING_SHARE else "info",
        title="Other processes used the machine's cores through the whole run (not the script)",
        evidence=(f"other processes used a median {found['others']:.1f} of the machine's {found['cores']} cores "
                  f"{found['window']} (system sampler){got_text(found, ctx)}. The step times, phase "
                  "times and throughput of this run are the busy machine's, not the script's"),
        recommendation=("nothing to change in the script because of this: measure when the machine is quiet, or "
                        "give the run cores of its own (a dedicated node, or other jobs kept off its cores with "
                        f"taskset or cgroups){threads_advice(ctx, found)}"),
        verify_with=f"{ctx.doctor_command()} (on a quiet machine)",
        impact=0.0,
    )


CHECKS = (machine_busy,)
