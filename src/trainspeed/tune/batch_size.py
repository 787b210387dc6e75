"""Batch-size search: the largest batch that fits, then the fastest per sample.

Candidates double the baseline batch while the memory estimated from the baseline trial
(peak x factor, an upper bound: weights and optimizer state do not grow with the batch)
stays under the device's memory. Each candidate is a real trial; one that runs out of memory
fails with its error ("failed" in the table) and larger ones are not crowned. The winner is the
candidate with the best per-sample speed, which is how every trial is compared anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainspeed.tune.knob_types import Candidate, Skip

if TYPE_CHECKING:
    from trainspeed.tune.knob_types import KnobContext

FACTORS = (2, 4, 8)
MEMORY_HEADROOM = 0.85
"""Use at most this share of the device's memory: the rest is the allocator's and the OS's."""


def batch_size_candidates(ctx: KnobContext, factors: tuple[int, ...] = FACTORS) -> list:
    b = int(ctx.get("data.batch_size") or 1)
    limit = (ctx.device.memory_bytes or 0) * MEMORY_HEADROOM
    out: list = []
    for k in factors:
        label = str(b * k)
        if ctx.baseline_memory and limit and ctx.baseline_memory * k > limit:
            out.append(Skip("batch_size", label,
                            f"estimated {ctx.baseline_memory * k / 2**30:.1f} GiB (baseline peak x{k}) "
                            f"exceeds {limit / 2**30:.1f} GiB usable"))
            break  # larger ones would not fit either
        out.append(Candidate("batch_size", label, {"data.batch_size": b * k}, cost_factor=float(k)))
    return out


def largest_fitting(results: dict[str, bool]) -> str | None:
    """Of {label: ran_ok}, the largest batch label that ran (labels are integers)."""
    ok = [int(label) for label, fine in results.items() if fine]
    return str(max(ok)) if ok else None
