"""A data loader's settings as the checks read them (`observation` events of kind "dataloader").

The doctor observes a foreign script's DataLoaders from outside; the Trainer built its own, and
a `Monitor.loader(loader)` loop hands its loader over: both state the same facts, so a run that
waits for data is diagnosed with the loader's real settings (num_workers on how many cores)
instead of as a script building batches in its loop. Duck-typed: no torch import here.
"""

from __future__ import annotations

import os
from typing import Any


def available_cores() -> int:
    """CPU cores this process may use (affinity-aware: containers, taskset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def is_data_loader(obj: Any) -> bool:
    """A torch DataLoader (or anything shaped like one: workers and a batch size)."""
    return hasattr(obj, "num_workers") and hasattr(obj, "batch_size") and hasattr(obj, "dataset")


def loader_batch_size(loader: Any) -> Any:
    """The loader's batch size; a loader built on a batch sampler (Accelerate's prepared
    DataLoaderShard: batch_size None, the size in its BatchSamplerShard) reads it there."""
    size = getattr(loader, "batch_size", None)
    return size if size is not None else getattr(getattr(loader, "batch_sampler", None), "batch_size", None)


def loader_facts(loader: Any, role: str, *, built_by: str, cores: int | None = None) -> dict[str, Any]:
    """The settings the checks read from a DataLoader (plain values; absent ones None).
    `built_by`: "engine" (the Trainer's data.* apply), "user" (a DataLoader the user built)."""
    dataset = getattr(loader, "dataset", None)
    try:
        length = len(dataset) if dataset is not None else None  # type: ignore[arg-type]
    except TypeError:  # an IterableDataset
        length = None
    collate = getattr(loader, "collate_fn", None)
    return {
        "role": role,
        "num_workers": int(getattr(loader, "num_workers", 0) or 0),
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "batch_size": loader_batch_size(loader),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "drop_last": bool(getattr(loader, "drop_last", False)),
        "dataset": type(dataset).__name__ if dataset is not None else type(loader).__name__,
        "dataset_len": length,
        "collate_fn": getattr(collate, "__name__", type(collate).__name__) if collate is not None else None,
        "cores": cores if cores is not None else available_cores(),
        "built_by": built_by,
    }


MAX_LOADERS = 8
"""Loaders a Monitor records (a loop that builds a new loader every epoch records the first few)."""


def observe_loader(mon: Any, iterable: Any, seen: set[int]) -> None:
    """`Monitor.loader(iterable)`: record a DataLoader's settings once (an `observation` event;
    the first loader handed over is the training loader). Called once per epoch, not per step."""
    if id(iterable) in seen or len(seen) >= MAX_LOADERS:
        return
    role = "other" if seen else "train"
    seen.add(id(iterable))
    if is_data_loader(iterable):
        mon.event("observation", kind="dataloader", **loader_facts(iterable, role, built_by="user"))


__all__ = ["MAX_LOADERS", "available_cores", "is_data_loader", "loader_batch_size", "loader_facts", "observe_loader"]
