"""DataLoader hooks: the time the training loop waits in `next()` is the "data" phase.

We patch `_BaseDataLoaderIter.__next__` (shared by the single- and multi-process iterators)
and `DataLoader.__iter__` (worker start-up, and how often a loader is re-iterated: one
`iter()` per epoch re-forks the workers unless `persistent_workers=True`).
A fetch under `torch.no_grad()` (or while an evaluation is open) belongs to evaluation.
`DataLoader.__init__` is wrapped only to remember where each loader was built (file:line in the
user's code): the script tuner changes exactly the training loader, at that line.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.sites import caller_site, format_site
from trainspeed.patches.callers import in_user_files
from trainspeed.telemetry.loader_facts import loader_batch_size

MAX_SITES_REMEMBERED = 256
"""Loader construction sites kept at most (a script that builds a loader per step stays bounded)."""


def available_cores() -> int:
    """CPU cores this process may use (affinity-aware, e.g. inside a container or taskset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def loader_settings(loader: DataLoader) -> dict[str, Any]:
    """The DataLoader settings the checks look at (plain values only)."""
    try:
        length = len(loader.dataset)  # type: ignore[arg-type]
    except TypeError:
        length = None
    return {
        "num_workers": int(loader.num_workers),
        "pin_memory": bool(loader.pin_memory),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "batch_size": loader_batch_size(loader),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "drop_last": bool(getattr(loader, "drop_last", False)),
        "dataset": type(loader.dataset).__name__,
        "dataset_len": length,
        "collate_fn": getattr(loader.collate_fn, "__name__", type(loader.collate_fn).__name__),
        "cores": available_cores(),
    }


SOURCE_DEPTH = 12
"""Frames walked up from a library's DataLoader construction to find the loader it copies."""


def _source_site(loader: DataLoader, built_at: dict[int, tuple[str, int]]) -> tuple[str, int] | None:
    """The site of the loader a library builds this one from: Accelerate's prepare() builds a
    DataLoaderShard from the user's DataLoader (its num_workers, pin_memory, collate_fn copied),
    so the line to change is the user's `DataLoader(...)`, not accelerate/data_loader.py. None
    when no frame holds an earlier loader (a library that builds its own: the Trainer's)."""
    frame = sys._getframe(2)
    for _ in range(SOURCE_DEPTH):
        if frame is None:
            return None
        for value in list(frame.f_locals.values()):
            if isinstance(value, DataLoader) and value is not loader and id(value) in built_at:
                return built_at[id(value)]
        frame = frame.f_back
    return None


def _kept(session: Session, iterator: Any) -> Any:
    """The iterator, remembered (weakly) so that stop_workers finds it when the script is over."""
    try:
        session.loader_iterators.add(iterator)
    except TypeError:  # not weak-referenceable (a library's own iterator with __slots__)
        pass
    return iterator


def stop_workers(session: Session) -> None:
    """Stop the worker processes of the script's DataLoader iterators; call it once the script
    is over (stopped at --steps, ended, crashed).

    Left alone, a persistent iterator stays in a reference cycle with the script's globals
    and is collected later by the cyclic garbage collector, which first runs the finalizers of
    its index queues (their feeder threads end) and then its `__del__`: the shutdown's `None`
    never reaches a worker, and `_shutdown_workers` waits out its 5 s join timeout per worker
    before it kills them. On an H100 a 16-worker tune trial of a data-bound script paid 80 s
    for it and the tune's budget ran out before its verification; under the doctor on this
    2-core VM, 2 workers added 10 s to a 10-step run. Shut down while the queues still run,
    they exit in milliseconds (what the iterator's own `__del__` does when its last
    reference goes, as at the end of a plain run)."""
    for iterator in list(session.loader_iterators):
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is None:
            continue
        try:
            shutdown()
        except Exception:  # noqa: BLE001 - a half-torn-down iterator: the collector's path still runs
            pass
    session.loader_iterators.clear()


def install(session: Session, patches: Patches) -> None:
    orig_next = _BaseDataLoaderIter.__next__
    orig_iter = DataLoader.__iter__
    orig_init = DataLoader.__init__
    built_at: dict[int, tuple[str, int]] = {}  # id(loader) -> construction site

    def __init__(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        s = session
        if s.on() and len(built_at) < MAX_SITES_REMEMBERED:
            where = caller_site(2)
            if where is not None and not in_user_files(where):
                where = _source_site(self, built_at) or where
            if where is not None:
                built_at[id(self)] = where

    def __next__(self: Any) -> Any:
        s = session
        if not s.on():
            return orig_next(self)
        s.in_data = True
        if s.eval_open or not torch.is_grad_enabled():
            s.open_eval()  # the wait stays in "eval"
            try:
                return orig_next(self)
            finally:
                s.in_data = False
        s.mon.begin("data")
        try:
            batch = orig_next(self)
        finally:
            s.in_data = False
            s.mon.end("data")
        s.on_batch(batch, loader=getattr(self, "_trainspeed_loader", None))
        return batch

    def __iter__(self: DataLoader) -> Any:
        s = session
        if not s.on():
            return _kept(s, orig_iter(self))
        evaluating = s.eval_open or not torch.is_grad_enabled()
        info = s.loaders.get(id(self))
        if info is None and len(s.loaders) < 64:
            s.internal += 1
            try:
                where = built_at.get(id(self))
                info = s.loaders[id(self)] = {**loader_settings(self), "iters": 0, "iter_seconds": 0.0,
                                             "role": "eval" if evaluating else "train",
                                             "site": format_site(*where) if where else None,
                                             "site_path": list(where) if where else None}
            finally:
                s.internal -= 1
        phase = None if evaluating else "data"
        if evaluating:
            s.open_eval()
        t0 = time.perf_counter()
        if phase:
            s.mon.begin(phase)
        try:
            it = _kept(s, orig_iter(self))
            try:  # the batch's loader, for the session's per-loader count of training fetches
                it._trainspeed_loader = id(self)
            except AttributeError:  # an iterator with __slots__: the count falls back to batch sizes
                pass
            return it
        finally:
            if phase:
                s.mon.end(phase)
            if info is not None:
                info["iters"] += 1
                info["iter_seconds"] += time.perf_counter() - t0

    __init__.__wrapped__ = orig_init  # type: ignore[attr-defined]
    patches.setattr(DataLoader, "__init__", __init__)
    patches.setattr(_BaseDataLoaderIter, "__next__", __next__)
    patches.setattr(DataLoader, "__iter__", __iter__)
