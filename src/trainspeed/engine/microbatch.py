"""`batch.auto_microbatch`: survive an out-of-memory step by splitting the micro-batch.

The approach Composer calls `device_train_microbatch_size="auto"`: run the step at the
configured size; when it runs out of memory, drop the half-done step (gradients, graph),
split every loader batch in two, and run the *same* step again, accumulating over the
halves. The global batch (data.batch_size x accumulation.steps) and therefore the optimizer
math stay the same; only the peak activation memory halves. The split factor is kept for
the rest of the run, and each change is recorded as an `auto_microbatch` event.

Why reactive rather than probing up front: a probe at step 0 misses what grows later
(longer sequences from the bucketing sampler, a fragmented allocator), and costs a
start-up search on every run. An OOM costs one retried step.

Single process only: an OOM on one rank would leave the others waiting in the gradient
all-reduce of a step that rank no longer runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from trainspeed.engine.accumulation import batch_size, split_batch
from trainspeed.errors import ConfigError, TrainspeedError

# Messages of allocators that raise a plain RuntimeError instead of torch.OutOfMemoryError
# (older CUDA builds, MPS, the CPU allocator, cuDNN/cuBLAS workspace allocation).
_OOM_MESSAGES = (
    "out of memory",
    "can't allocate memory",
    "cudnn_status_alloc_failed",
    "cublas_status_alloc_failed",
)


def is_oom(exc: BaseException) -> bool:
    """Whether `exc` is an allocator running out of memory (any device)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return any(m in text for m in _OOM_MESSAGES)
    return False


def auto_microbatch_enabled(requested: bool, world_size: int) -> bool:
    """Whether batch.auto_microbatch applies; ConfigError when it cannot (several ranks)."""
    if not requested:
        return False
    if world_size > 1:
        raise ConfigError(
            "batch.auto_microbatch works in a single process only: an out-of-memory retry on one "
            "rank would leave the others waiting in the gradient all-reduce. Set "
            "batch.auto_microbatch=false and pick data.batch_size with `trainspeed tune --knobs batch_size`."
        )
    return True


class MicroBatchTooLargeError(TrainspeedError):
    """Out of memory even with one sample per micro-batch."""


@dataclass
class Piece:
    """One slice of a loader batch, with the share of the step's loss it carries."""

    batch: Any
    weight: float


@dataclass
class MicroBatcher:
    """Splits each loader batch into `split` pieces; doubles `split` after an OOM."""

    split: int = 1

    def pieces(self, batches: Sequence[Any], weights: Sequence[float], normalize: str,
               stats_fn: Callable[[Any], Any]) -> list[Piece]:
        """Each batch cut into `split` pieces; piece weights sum to the batch's weight.

        A piece's share is its sample count (the loss is a mean over samples) or, with
        accumulation.normalize="tokens", its real-token count (computed on the piece)."""
        if self.split == 1:
            return [Piece(b, float(w)) for b, w in zip(batches, weights)]
        out: list[Piece] = []
        for batch, weight in zip(batches, weights):
            size = batch_size(batch) or 1
            parts = split_batch(batch, min(self.split, size))
            if normalize == "tokens":
                shares = [float(stats_fn(p).tokens) for p in parts]
            else:
                shares = [float(batch_size(p) or 1) for p in parts]
            total = sum(shares) or 1.0
            out += [Piece(p, float(weight) * s / total) for p, s in zip(parts, shares)]
        return out

    def grow(self, batches: Sequence[Any], exc: BaseException) -> dict[str, Any]:
        """Double the split after `exc`; raise when a piece is already one sample."""
        largest = max(batch_size(b) or 1 for b in batches)
        current = -(-largest // self.split)
        if current <= 1:
            raise MicroBatchTooLargeError(
                "out of memory with a micro-batch of one sample, so batch.auto_microbatch cannot "
                "split further. Reduce the model or sequence size, enable activation_checkpointing "
                f"or precision.mode=bf16-mixed. The allocator said: {exc}"
            ) from exc
        old = self.split
        self.split *= 2
        return {"split": self.split, "previous_split": old, "micro_batch": -(-largest // self.split),
                "previous_micro_batch": current, "error": str(exc).splitlines()[0][:300]}


def free_after_oom(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Drop the half-done step's gradients and give cached blocks back before the retry."""
    optimizer.zero_grad(set_to_none=True)
    for p in model.parameters():  # parameters the optimizer does not hold
        p.grad = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
