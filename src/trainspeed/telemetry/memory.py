"""Memory readings: host RSS (main process + DataLoader workers) and CUDA allocator counters.

Everything here reads host-side counters: psutil for RSS, and the CUDA caching allocator's
statistics, which PyTorch keeps on the host. None of it synchronizes with the GPU, so it is
safe to call at every log interval.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["process_rss", "cuda_memory", "interval_memory", "reset_cuda_peak"]

_PROC: Any = None
_PROC_PID: int | None = None


def _process():
    """The psutil handle of this process, re-created after a fork (workers must not reuse the parent's)."""
    global _PROC, _PROC_PID
    import psutil

    pid = os.getpid()
    if _PROC is None or _PROC_PID != pid:
        _PROC, _PROC_PID = psutil.Process(pid), pid
    return _PROC


def process_rss(include_children: bool = True) -> tuple[int, int]:
    """(RSS of this process, summed RSS of its child processes) in bytes.

    Children are DataLoader workers and anything else this process spawned. A child that exits
    between listing and reading is skipped. Summed RSS counts pages shared copy-on-write with
    the parent once per process, so it overstates the true total; it is the number that grows
    when workers leak (e.g. Python lists of objects touched by every worker).
    """
    import psutil

    proc = _process()
    try:
        main = int(proc.memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # pragma: no cover - our own process
        main = 0
    children = 0
    if include_children:
        try:
            kids = proc.children(recursive=True)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            kids = []
        for child in kids:
            try:
                children += int(child.memory_info().rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # the worker exited (or is exiting) between listing and reading
    return main, children


def _cuda_api():
    """torch.cuda, behind a function so tests can substitute a fake on machines without CUDA."""
    import torch

    return torch.cuda


_TOTAL_CACHE: dict[int, int] = {}


def _index(cuda, device) -> int | None:
    if device is None:
        return int(cuda.current_device())
    import torch

    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type != "cuda":
        return None
    return int(dev.index) if dev.index is not None else int(cuda.current_device())


def cuda_memory(device=None) -> dict[str, int]:
    """Allocator counters of one CUDA device, or {} when CUDA is unavailable or `device` is not CUDA.

    cuda_alloc_peak     max bytes held by tensors since the last reset_cuda_peak
    cuda_reserved_peak  max bytes the caching allocator reserved from the driver
    cuda_alloc_retries  times an allocation failed, the cache was flushed and it was retried;
                        a growing count means fragmentation is forcing cudaFree + sync
    cuda_total          the device's total memory
    """
    cuda = _cuda_api()
    if not cuda.is_available():
        return {}
    index = _index(cuda, device)
    if index is None:
        return {}
    # Host-side reads of the caching allocator's counters: no device synchronization.
    stats = cuda.memory_stats(index)
    if index not in _TOTAL_CACHE:
        _TOTAL_CACHE[index] = int(cuda.get_device_properties(index).total_memory)
    return {
        "cuda_alloc_peak": int(cuda.max_memory_allocated(index)),
        "cuda_reserved_peak": int(cuda.max_memory_reserved(index)),
        "cuda_alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "cuda_total": _TOTAL_CACHE[index],
    }


def interval_memory(cuda_device: Any, latest: dict[str, Any]) -> dict[str, Any]:
    """The `mem` field of the step records written at one log interval.

    CUDA allocator counters when `cuda_device` is given (None on the CPU: nothing to read, and
    no reason to touch torch.cuda). RSS from the system sampler's `latest` reading, which
    includes the DataLoader workers, when it has one; otherwise this process's own RSS only,
    since scanning /proc for workers costs milliseconds and is the sampler's job, off the
    training thread.
    """
    mem: dict[str, Any] = dict(cuda_memory(cuda_device)) if cuda_device is not None else {}
    if latest.get("rss") is not None:
        mem["rss"] = latest.get("rss")
        mem["worker_rss"] = latest.get("children_rss")
    else:
        mem["rss"] = process_rss(include_children=False)[0]
    return mem


def reset_cuda_peak(device=None) -> None:
    """Start a new peak window (e.g. per log interval); a no-op without CUDA."""
    cuda = _cuda_api()
    if not cuda.is_available():
        return
    index = _index(cuda, device)
    if index is not None:
        cuda.reset_peak_memory_stats(index)
