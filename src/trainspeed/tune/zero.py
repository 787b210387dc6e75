"""The ZeRO knobs' rules (zero_stage, overlap_comm, bucket_size), shared by a config's knobs
(distributed.zero_stage / overlap_comm / bucket_size, knobs.py) and a DeepSpeed script's (a
copy of its --deepspeed_config JSON, script_knobs.py). Pure: the zero_optimization section a
trial would run, and a function that turns a value into the knob's settings, in; Candidates
and Skips out (a Skip given for the state, the knob not applying at all, comes back as it is).

What a trial shows. A tune's trials run one process (`trainspeed train`, `python train.py`), so
ZeRO partitions over one rank: nothing is sharded and no gradient crosses a wire. A stage's
trial measures what the stage costs on one rank (ZeRO-1/2 keep flat fp32 copies and copy every
gradient through a reduction bucket; stage 0 steps the plain optimizer) and its memory there,
not the all-reduce against reduce-scatter traffic of N ranks, nor the memory N ranks would save.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from trainspeed.tune.knob_types import Candidate, Skip

DEFAULT_BUCKET = 500_000_000
"""DeepSpeed's reduce_bucket_size and allgather_bucket_size when a config leaves them unset
(elements)."""
BUCKET_SIZES = (50_000_000, 200_000_000, DEFAULT_BUCKET)
"""Bucket sizes tried (elements), the current one left out. Smaller buckets start reductions
sooner (more overlap with backward) in more, smaller collectives; they also shrink the
buffers ZeRO allocates every micro-step: reduce_bucket_size elements, twice with overlap_comm
(2-4 GB at the default in fp32). Larger than the default only adds memory."""
STAGE3_MEMORY_SHARE = 0.5
"""ZeRO-3 is tried only where the baseline peaked at this share of the device's memory or more
(see stage_items)."""


@dataclass(frozen=True, slots=True)
class ZeroState:
    """The ZeRO settings a trial runs, DeepSpeed's defaults filled in."""

    stage: int
    overlap_comm: bool
    bucket_size: int | None
    """reduce_bucket_size in elements; None where the config says "auto" (Hugging Face's
    Trainer fills it in from the model's hidden size)."""


def zero_state(zero: dict[str, Any] | None) -> ZeroState:
    """A zero_optimization section as DeepSpeed reads it: stage 0 when unset, overlap_comm on
    at stage 3 only (DeepSpeed's default), buckets of 5e8 elements."""
    zero = zero or {}
    stage = zero.get("stage", 0)
    stage = int(stage) if isinstance(stage, (int, float)) and not isinstance(stage, bool) else 0
    overlap = zero.get("overlap_comm")
    bucket = zero.get("reduce_bucket_size", DEFAULT_BUCKET)
    return ZeroState(stage=stage, overlap_comm=bool(overlap) if isinstance(overlap, bool) else stage == 3,
                     bucket_size=int(bucket) if isinstance(bucket, (int, float)) and not isinstance(bucket, bool)
                     else None)


def bucket_label(n: int) -> str:
    """5e7 for 50,000,000 elements (2e8, 5e8, 1.5e8)."""
    mantissa, exponent = f"{n:.2e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def memory_share(baseline_memory: float | None, device_memory: float | None) -> float | None:
    """The baseline's peak memory as a share of the device's (None: either unknown)."""
    return baseline_memory / device_memory if baseline_memory and device_memory else None


def stage_items(state: ZeroState | Skip, setting: Callable[[int], dict[str, Any]],
                memory_share: float | None) -> list:
    """Stages 0-2 other than the current one; stage 3 only under memory pressure.

    ZeRO-3 partitions the parameters too: every layer's weights are all-gathered before its
    forward and again before its backward. Per step it is the slowest stage, and the reason to
    run it is memory (a model whose weights, gradients and optimizer states do not fit beside
    the activations with stage 2), never speed. So a trial of it is spent only where memory is
    the question: the baseline took at least half the device's memory (`memory_share`:
    baseline peak / device memory), and the table's memory column shows what stage 3 frees or
    costs beside its time. Below that stage 2 fits with room to spare, and a stage-3 trial
    could only read slower (on one rank, a tune's trial, it shards nothing either)."""
    if isinstance(state, Skip):
        return [state]
    out: list = []
    for stage in (0, 1, 2, 3):
        if stage == state.stage:
            continue
        if stage == 3 and (memory_share is None or memory_share < STAGE3_MEMORY_SHARE):
            seen = "unknown" if memory_share is None else f"{memory_share:.0%}"
            out.append(Skip("zero_stage", "3", f"ZeRO-3 trades speed for memory (it all-gathers every layer's "
                                               f"weights in forward and backward): tried only when the baseline "
                                               f"peaks at >= {STAGE3_MEMORY_SHARE:.0%} of the device's memory "
                                               f"(it peaked at {seen})"))
            continue
        out.append(Candidate("zero_stage", str(stage), setting(stage)))
    return out


def _needs_zero(knob: str, label: str, state: ZeroState) -> Skip | None:
    if state.stage == 0:
        return Skip(knob, label, "ZeRO stage 0 has no ZeRO reduction to tune (DeepSpeed all-reduces after "
                                 "backward in fixed buffers); tried on top of a zero_stage winner >= 1", deferred=True)
    return None


def overlap_items(state: ZeroState | Skip, setting: Callable[[bool], dict[str, Any]]) -> list:
    """overlap_comm flipped: the gradient reduction overlapped with backward (a second bucket
    buffer, a side stream on a GPU) or run after it."""
    if isinstance(state, Skip):
        return [state]
    flipped = not state.overlap_comm
    label = str(flipped).lower()
    skip = _needs_zero("overlap_comm", label, state)
    return [skip] if skip else [Candidate("overlap_comm", label, setting(flipped))]


def bucket_items(state: ZeroState | Skip, setting: Callable[[int], dict[str, Any]]) -> list:
    """BUCKET_SIZES other than the current reduce_bucket_size."""
    if isinstance(state, Skip):
        return [state]
    values = [n for n in BUCKET_SIZES if n != state.bucket_size]
    skip = _needs_zero("bucket_size", bucket_label(values[0]), state)
    return [skip] if skip else [Candidate("bucket_size", bucket_label(n), setting(n)) for n in values]


__all__ = ["BUCKET_SIZES", "DEFAULT_BUCKET", "STAGE3_MEMORY_SHARE", "ZeroState", "bucket_items", "bucket_label",
           "memory_share", "overlap_items", "stage_items", "zero_state"]
