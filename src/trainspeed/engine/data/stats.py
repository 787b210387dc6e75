"""Per-batch sample/token/padding counts, for throughput and padding-waste figures.

`BatchStats` is the shared dataclass of `trainspeed.recipes.base`: `tokens` counts the real
(non-pad) tokens, `pad_tokens` the padding the batch carries. Token throughput must count
real tokens only, or padding would make a wasteful run look fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from trainspeed.recipes.base import BatchStats

__all__ = ["BatchStats", "batch_stats", "find_mask", "pad_share"]

MASK_KEY = "attention_mask"

# The stats of (inputs, targets) batches, by the inputs' shape: BatchStats is frozen, so one
# object per shape serves every step (building one is a Python frame, every step), found with
# one dict lookup on the shape.
_BY_SHAPE: dict[Any, BatchStats] = {}


def find_mask(batch: Any) -> Any:
    """The bool attention mask of a batch made by PadCollate, or None.

    Dict batches carry it under "attention_mask"; tuple batches end with
    (..., attention_mask, lengths) and a bare-tensor sample becomes (ids, attention_mask, lengths).
    """
    if isinstance(batch, Mapping):
        mask = batch.get(MASK_KEY)
        return mask if isinstance(mask, torch.Tensor) else None
    if isinstance(batch, (tuple, list)) and len(batch) >= 3:
        mask = batch[-2]
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.dim() == 2:
            return mask
    return None


def _first_tensor(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, (tuple, list)) or isinstance(batch, Mapping):
        for v in values:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def batch_stats(batch: Any) -> BatchStats:
    """Count samples, real tokens and pad tokens of a collated batch.

    With an attention mask (PadCollate batches): samples = mask rows, tokens = mask.sum(),
    pad_tokens = mask.numel() - tokens. Without one: samples = len(first tensor), no tokens.

    Call it on the host batch (before the copy to the GPU): on a CPU tensor the sum is free,
    on a CUDA tensor `.item()` is a CPU-GPU sync point. DevicePrefetcher(stats_fn=batch_stats)
    does exactly that.
    """
    if type(batch) in (tuple, list) and len(batch) < 3 and batch and type(batch[0]) is torch.Tensor:
        # (inputs, targets): the common batch, answered without the generic walk (per step)
        shape = batch[0].shape
        stats = _BY_SHAPE.get(shape)
        if stats is None:  # a new shape: few per run (a short last batch, a new length)
            if len(_BY_SHAPE) > 256:
                _BY_SHAPE.clear()
            stats = _BY_SHAPE[shape] = BatchStats(samples=int(shape[0]) if shape else 1)
        return stats
    mask = find_mask(batch)
    if mask is not None:
        real = int(mask.sum().item())  # sync point if the mask lives on a GPU (see docstring)
        return BatchStats(samples=int(mask.shape[0]), tokens=real, pad_tokens=int(mask.numel()) - real)
    first = _first_tensor(batch)
    samples = int(first.shape[0]) if first is not None and first.dim() > 0 else 1
    return BatchStats(samples=samples)


def pad_share(stats: BatchStats) -> float | None:
    """Fraction of the processed token slots that are padding: pad / (real + pad)."""
    total = stats.tokens + stats.pad_tokens
    return stats.pad_tokens / total if total else None
