"""Step records: one log interval's pending steps as the dicts written to steps.jsonl (the
schema in DESIGN.md). Pure: the Monitor resolves the timeline, reads the losses and memory,
and hands them here."""

from __future__ import annotations

import math
from typing import Any, Sequence

from trainspeed.telemetry import schema
from trainspeed.telemetry.schema import MEASURED_PHASES

__all__ = ["pending_rows", "step_cpu", "step_records"]


def step_records(
    resolved: Sequence[tuple[float, Sequence[float]]],
    rows: Sequence[tuple],
    losses: Sequence[float],
    *,
    first_step: int,
    wall_offset: float,
    mem: dict[str, Any],
    rank: int,
    cpu_before: float | None = None,
) -> list[dict[str, Any]]:
    """The records of steps first_step + 1, first_step + 2, ...: `resolved` holds each step's
    (t_step, per-phase seconds) from the timeline, `rows` its (samples, tokens, pad, lr, syncs,
    warmup, t_end on the perf_counter clock[, cpu_end: process CPU seconds at the step's end]),
    `losses` its loss (NaN when none was given); `wall_offset` turns perf_counter times into
    wall-clock times; `cpu_before` is the process CPU seconds at the end of the step before
    first_step + 1. A record's `cpu` is the process's CPU seconds in the step (all threads:
    more than t_step when intra-op threads work in parallel), null when unknown. A row's
    cpu_end may be None (a short step: the Monitor read the CPU clock after it, see
    CPU_READ_EVERY_S): the steps up to the next reading share its CPU seconds (step_cpu)."""
    version, n_measured = schema.SCHEMA_VERSION, len(MEASURED_PHASES)
    cpus = step_cpu([r[7] if len(r) > 7 else None for r in rows], cpu_before)
    records = []
    for i in range(len(rows)):
        t_step, phases = resolved[i]
        t_step = float(t_step)
        row = [float(x) for x in phases[:n_measured]]  # the rest is "other"
        phase_map = dict(zip(MEASURED_PHASES, row))
        phase_map["other"] = max(0.0, t_step - sum(row))
        samples, tokens, pad, lr, syncs, warm, t_end = rows[i][:7]
        cpu = cpus[i]
        tok, pad = int(tokens), int(pad)
        records.append(
            {
                "schema": version,
                "step": first_step + i + 1,
                "t_wall": t_end + wall_offset,
                "t_step": t_step,
                "cpu": cpu,
                "phases": phase_map,
                "samples": int(samples),
                "tokens": tok,
                # tokens counts real tokens; padding is on top of them
                "pad_share": pad / (tok + pad) if tok or pad else None,
                "loss": _finite(losses[i]),
                "lr": None if lr is None else _finite(lr),
                "mem": mem,
                "syncs": int(syncs),
                "warmup": bool(warm),
                "rank": rank,
            }
        )
    return records


def pending_rows(pending: list[tuple], first: int, syncs_before: int, warm_marked: set[int],
               warmup_steps: int) -> list[tuple]:
    """The Monitor's pending rows (steps first, first + 1, ... counted from 0) as step_records
    reads them: each step's own host syncs (a row holds the total so far, `syncs_before` the
    total before the first) and its warm-up flag (given to step(), marked by mark_warmup, or
    one of the first `warmup_steps`); the loss, a row's last item, is left out (flush reads it)."""
    rows, before = [], syncs_before
    for j, (samples, tokens, pad, lr, syncs, warm, t_end, cpu, _) in enumerate(pending):
        i = first + j
        rows.append((samples, tokens, pad, lr, syncs - before, warm or i in warm_marked or i < warmup_steps,
                     t_end, cpu))
        before = syncs
    return rows


def step_cpu(cpu_ends: Sequence[float | None], cpu_before: float | None) -> list[float | None]:
    """Each step's process CPU seconds from the CPU clock's readings at step ends. A step
    without a reading (None: read at a later step's end) shares the CPU seconds up to the next
    reading evenly with the steps in between, not by their wall time: a step that another
    process held off the core took longer without using more CPU, and that difference is the
    evidence of contention (telemetry/contention.py). Steps after the last reading, or with
    no reading before them, get None."""
    out: list[float | None] = [None] * len(cpu_ends)
    start = 0  # first step of the group that ends at the next reading
    for i, end in enumerate(cpu_ends):
        if end is None:
            continue
        if cpu_before is not None:
            spent = max(0.0, float(end - cpu_before))
            share = spent / (i + 1 - start)
            for j in range(start, i + 1):
                out[j] = share
        cpu_before, start = end, i + 1
    return out


def _finite(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None
