"""Host-to-device batch movement, optionally overlapped with compute on a side CUDA stream.

Without prefetching, `batch.to("cuda")` runs on the compute stream: the GPU waits for the
copy before the forward pass. DevicePrefetcher issues the copy of batch i+1 on a separate
copy stream right after handing out batch i, so the copy overlaps with batch i's compute.
Two hazards, both handled here:
  * the compute stream must not read the batch before its copy finished:
    `current_stream.wait_stream(copy_stream)` (a GPU-side wait, not a host sync);
  * the caching allocator records which stream allocated a block and may hand it out again
    as soon as the *copy* stream is done with it; `tensor.record_stream(current_stream)`
    tells it the compute stream uses the memory too, so it is not reused too early.
The copy is only truly asynchronous from pinned host memory (DataLoader pin_memory=True);
from pageable memory `non_blocking=True` silently degrades to a synchronous copy.

The CUDA stream API is behind the `StreamBackend` protocol so the logic is tested on CPU
with a fake backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

__all__ = ["move_to_device", "map_tensors", "DevicePrefetcher", "StreamBackend", "CudaStreamBackend"]


def map_tensors(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply fn to every tensor inside dicts, lists, tuples, namedtuples and dataclasses."""
    import torch

    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        items = {k: map_tensors(v, fn) for k, v in obj.items()}
        try:
            return type(obj)(items)
        except TypeError:  # mappings without a dict constructor
            return items
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    return obj


def move_to_device(batch: Any, device: Any, non_blocking: bool = False) -> Any:
    """Copy every tensor of `batch` to `device`; other leaves are returned unchanged.
    A tensor already on `device` is returned as is (Tensor.to is a no-op then)."""
    return map_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


class StreamBackend(Protocol):
    """The slice of the CUDA stream API DevicePrefetcher needs (injectable for tests)."""

    def new_stream(self, device: Any) -> Any: ...

    def current_stream(self, device: Any) -> Any: ...

    def stream_context(self, stream: Any) -> Any: ...

    def wait_stream(self, waiter: Any, stream: Any) -> None: ...

    def record_stream(self, tensor: Any, stream: Any) -> None: ...


class CudaStreamBackend:
    """StreamBackend on torch.cuda."""

    def new_stream(self, device: Any) -> Any:
        import torch

        return torch.cuda.Stream(device=device)

    def current_stream(self, device: Any) -> Any:
        import torch

        return torch.cuda.current_stream(device)

    def stream_context(self, stream: Any) -> Any:
        import torch

        return torch.cuda.stream(stream)

    def wait_stream(self, waiter: Any, stream: Any) -> None:
        waiter.wait_stream(stream)  # GPU-side dependency; the host does not block

    def record_stream(self, tensor: Any, stream: Any) -> None:
        tensor.record_stream(stream)


def _is_cuda(device: Any) -> bool:
    import torch

    return torch.device(device).type == "cuda"


class DevicePrefetcher:
    """Iterate `iterable`, yielding batches already on `device`.

    On CUDA (and enabled) the next batch is copied on a side stream while the current one
    trains; on CPU, or disabled, it is a plain pass-through with `move_to_device`.
    `stats_fn` (e.g. batch_stats) runs on the host batch before the copy, so counting pad
    tokens never syncs with the GPU; the figure for the batch just yielded is `last_stats`.
    """

    def __init__(
        self,
        iterable: Iterable[Any],
        device: Any,
        *,
        non_blocking: bool = True,
        enabled: bool = True,
        stats_fn: Callable[[Any], Any] | None = None,
        backend: StreamBackend | None = None,
    ) -> None:
        self.iterable = iterable
        self.device = device
        self.non_blocking = non_blocking
        self.stats_fn = stats_fn
        self.last_stats: Any = None
        # a backend passed in (tests, custom devices) forces the side-stream path
        self.uses_stream = bool(enabled) and (backend is not None or _is_cuda(device))
        self._backend: StreamBackend | None = (backend or CudaStreamBackend()) if self.uses_stream else None
        self._stream: Any = None

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if not self.uses_stream:
            return self._plain()
        return self._streamed()

    # ------------------------------------------------------------------ paths
    def _plain(self) -> Iterator[Any]:
        for batch in self.iterable:
            stats = self.stats_fn(batch) if self.stats_fn is not None else None
            moved = move_to_device(batch, self.device, self.non_blocking)
            self.last_stats = stats
            yield moved

    def _preload(self, it: Iterator[Any]) -> tuple[bool, Any, Any]:
        backend = self._backend
        try:
            batch = next(it)
        except StopIteration:
            return False, None, None
        stats = self.stats_fn(batch) if self.stats_fn is not None else None
        with backend.stream_context(self._stream):  # type: ignore[union-attr]
            moved = move_to_device(batch, self.device, self.non_blocking)
        return True, moved, stats

    def _streamed(self) -> Iterator[Any]:
        backend = self._backend
        if backend is None:  # unreachable: __iter__ only takes this path with a backend
            raise RuntimeError("DevicePrefetcher stream path without a stream backend")
        if self._stream is None:
            self._stream = backend.new_stream(self.device)
        it = iter(self.iterable)
        ok, nxt, stats = self._preload(it)
        while ok:
            current = backend.current_stream(self.device)
            # the compute stream waits (on the GPU) for the copy of this batch to finish
            backend.wait_stream(current, self._stream)
            batch = nxt
            # memory allocated on the copy stream is used by the compute stream: tell the
            # caching allocator, or it may reuse the block while compute still reads it
            map_tensors(batch, lambda t: backend.record_stream(t, current))
            self.last_stats = stats
            # issue the next copy before handing out this batch so the two overlap
            ok, nxt, stats = self._preload(it)
            yield batch
