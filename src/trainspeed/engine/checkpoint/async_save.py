"""Asynchronous checkpoint writes: training blocks only for a copy to host memory.

The calling (training) thread deep-copies every tensor of the state to CPU memory — on CUDA
into pinned buffers with non_blocking copies and one deliberate synchronize — and hands the
copy to ONE background writer thread. A new save first waits for the previous write, so at
most one host copy exists at a time (bounded memory). An exception in the writer thread is
kept and raised as CheckpointError on the next `submit` or `wait`.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainspeed.errors import CheckpointError


@dataclass(slots=True)
class _Copier:
    """Deep-copies a nested state to host memory, keeping tensors that alias each other aliased."""

    pool: dict[int, Any]
    """Host buffers (pinned for CUDA sources) from the previous save, by slot, reused when shape
    and dtype match: one host copy of the state stays allocated between saves."""
    slot: int = 0
    any_cuda: bool = False

    def copy(self, obj: Any, memo: dict[tuple, Any]) -> Any:
        import torch

        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, memo)
        if isinstance(obj, dict):
            out = {k: self.copy(v, memo) for k, v in obj.items()}
            if type(obj) is not dict:  # OrderedDict & co.
                try:
                    return type(obj)(out)
                except TypeError:
                    return out
            return out
        if isinstance(obj, list):
            return [self.copy(v, memo) for v in obj]
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return tuple(self.copy(v, memo) for v in obj)
        if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
            return obj
        return copy.deepcopy(obj)

    def _tensor(self, t: Any, memo: dict[tuple, Any]) -> Any:
        import torch

        t = t.detach()
        key = None
        if t.layout == torch.strided and t.device.type != "meta":
            # Tied weights show up as distinct tensor objects over one storage: copy them once.
            key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                   t.stride(), t.dtype)
            if key in memo:
                return memo[key]
        buf = self.pool.get(self.slot) if t.device.type in ("cuda", "cpu") else None
        fits = (buf is not None and buf.shape == t.shape and buf.dtype == t.dtype
                and (t.device.type != "cuda" or buf.is_pinned()))
        if t.device.type == "cuda":
            self.any_cuda = True
            if not fits:
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
                self.pool[self.slot] = buf
            self.slot += 1
            # Queued on the current stream; made visible by the one synchronize in to_host().
            out = buf.copy_(t, non_blocking=True)
        elif t.device.type == "cpu":
            # Training mutates parameters in place, so the writer needs a snapshot. Reusing the
            # previous save's buffer avoids fresh allocations, whose first-touch page faults cost
            # more than the copy itself for a large model.
            if fits:
                out = buf.copy_(t)
            else:
                out = t.clone(memory_format=torch.contiguous_format)
                self.pool[self.slot] = out
            self.slot += 1
        else:
            out = t.to("cpu")
        if key is not None:
            memo[key] = out
        return out


def to_host(state: Any, pool: dict[int, Any] | None = None) -> Any:
    """A deep copy of `state` whose tensors all live in CPU memory.

    `pool` (slot -> host tensor) lets repeated saves reuse host buffers (pinned ones for CUDA
    tensors); pass the same dict each time, and only once the previous copy is no longer read:
    the buffers are overwritten in place.
    """
    copier = _Copier(pool=pool if pool is not None else {})
    out = copier.copy(state, {})
    if copier.any_cuda:
        import torch

        # Deliberate CPU-GPU sync point: the non_blocking device->pinned copies must be complete
        # before the writer thread reads the buffers. One sync per checkpoint, not per tensor.
        torch.cuda.synchronize()
    return out


@dataclass(slots=True)
class SubmitTiming:
    waited_s: float
    """Time spent waiting for the previous write to finish."""
    copy_s: float
    """Time spent copying the state to host memory."""

    @property
    def blocking_s(self) -> float:
        return self.waited_s + self.copy_s


class AsyncSaver:
    """Runs write jobs on one background thread, one at a time, after a host copy of the state."""

    def __init__(self, *, pin_pool: bool = True):
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._pool: dict[int, Any] | None = {} if pin_pool else None
        self.last_write_s: float | None = None
        """Seconds the most recent completed write took on the writer thread."""

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Block until the current write (if any) finished; raise its error as CheckpointError."""
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        with self._lock:
            error, self._error = self._error, None
        if isinstance(error, CheckpointError):  # already one line (a full disk: DiskFullError)
            raise error
        if error is not None:
            raise CheckpointError(f"background checkpoint write failed: {error!r}") from error

    def submit(self, state: Any, job: Callable[[Any, SubmitTiming], None], *,
               name: str = "trainspeed-ckpt-writer") -> SubmitTiming:
        """Copy `state` to host memory now, then run `job(host_state, timing)` on the writer thread.

        Waits for the previous job first (and raises its error, if it failed).
        """
        t0 = time.perf_counter()
        self.wait()
        t1 = time.perf_counter()
        host = to_host(state, self._pool)
        timing = SubmitTiming(waited_s=t1 - t0, copy_s=time.perf_counter() - t1)

        def _run() -> None:
            start = time.perf_counter()
            try:
                job(host, timing)
            except BaseException as exc:  # surfaced on the next submit()/wait()
                with self._lock:
                    self._error = exc
            finally:
                self.last_write_s = time.perf_counter() - start

        # Non-daemon: an interpreter that is exiting still finishes the write in progress.
        self._thread = threading.Thread(target=_run, name=name, daemon=False)
        self._thread.start()
        return timing
