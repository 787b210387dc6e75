"""More compute threads than cores, from the script's own processes.

pytorch/examples' mnist_hogwild trains in 2 processes on a 2-core machine, and torch gives each
process one compute thread per core: 4 threads on 2 cores. A thread that waits for a
descheduled sibling spins, so the step time grows far beyond the arithmetic: the tune measured
`torch.set_num_threads(1)` at 11.2x alone and 7.2x verified. torchrun sets OMP_NUM_THREADS=1
for several processes per node for the same reason; a script that starts its processes itself
(or runs under a launcher that does not) gets torch's default.
"""

from __future__ import annotations

from trainspeed.doctor.checks.context import CheckContext
from trainspeed.doctor.checks.machine import torch_threads, usable_cores
from trainspeed.doctor.findings import Finding


def oversubscribed(ctx: CheckContext) -> tuple[int, int, int] | None:
    """(processes, threads each, cores) when CPU training in several processes runs more
    compute threads in all than the machine has cores, else None."""
    processes = len(ctx.summary.get("ranks") or [])
    threads, cores = torch_threads(ctx), usable_cores(ctx)
    if ctx.device_type != "cpu" or processes < 2 or not threads or not cores or processes * threads <= cores:
        return None
    return processes, threads, cores


def oversubscribed_threads(ctx: CheckContext) -> Finding | None:
    """CPU training in several processes whose compute threads together exceed the cores."""
    found = oversubscribed(ctx)
    if found is None:
        return None
    processes, threads, cores = found
    total = processes * threads
    fits = max(1, cores // processes)
    # A share, not a measurement: the threads beyond the cores are what spins (the tune measures)
    impact = 1.0 - cores / total
    if fits < threads:
        fix = (f"one thread per core in all: torch.set_num_threads({fits}) at the top of the script (each "
               f"process runs it), or OMP_NUM_THREADS={fits} in the environment, as torchrun sets for several "
               "processes per node")
        verify = ctx.tune_command("threads")
    else:  # one thread each already: the processes themselves are too many
        fix = f"start at most {cores} training processes on this machine (one thread each already)"
        verify = ctx.doctor_command()
    return Finding(
        id="threads_oversubscribed",
        severity="critical" if total >= 2 * cores else "warning",
        title=f"{processes} training processes run {threads} compute thread{'s' if threads > 1 else ''} each "
              f"on {cores} cores",
        evidence=(f"{processes} processes x {threads} torch compute threads = {total} threads on {cores} usable "
                  "cores: a thread that waits for a descheduled sibling spins, and every step pays for it"),
        recommendation=fix,
        verify_with=verify,
        impact=impact,
        impact_estimated=True,
        basis="the threads beyond the cores as a share of all threads; the tune measures it",
    )


CHECKS = (oversubscribed_threads,)
