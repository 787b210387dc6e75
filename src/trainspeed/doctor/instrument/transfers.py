"""Host-to-device copies: `Tensor.to(device)` / `Tensor.cuda()` outside the model's forward
are the "h2d" phase; `.to("cpu")` of an accelerator tensor is a device-to-host sync.

Calls from torch internals (`model.to(device)` goes through `Module._apply`) are not batch
copies and pass through untouched; dtype-only `.to(torch.float16)` calls take a fast path.

Batches built in the main process without a DataLoader (nanoGPT's `get_batch`: random offsets
from `torch.randint`, memmap slices through `torch.from_numpy`, `torch.stack`) are the "data"
phase: such a call made by the user's code outside every other phase (forward, backward,
optimizer step, evaluation, a DataLoader fetch) opens "data", and it lasts until the next
phase transition any hook makes (the forward, the h2d copy, the backward...), so the Python
and numpy work between those calls is data too. Work before the first such call (opening the
memmap) stays "other", and so does setup before the first training forward (building a
dataset is not a step's data wait).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.sites import called_from_torch
from trainspeed.doctor.instrument.syncs import record

_DEVICE_CACHE: dict[Any, torch.device] = {}


def target_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    """The device a `Tensor.to(...)` call moves to, or None for a dtype/format-only call."""
    spec = kwargs.get("device")
    if spec is None and args:
        first = args[0]
        if isinstance(first, torch.Tensor):
            return first.device
        if isinstance(first, (str, torch.device)) or (isinstance(first, int) and not isinstance(first, bool)):
            spec = first
    if spec is None:
        return None
    if isinstance(spec, torch.device):
        return spec
    device = _DEVICE_CACHE.get(spec)
    if device is None:
        try:
            device = torch.device(spec)
        except (RuntimeError, TypeError):
            return None
        if len(_DEVICE_CACHE) < 64:
            _DEVICE_CACHE[spec] = device
    return device


def _same(src: torch.device, dst: torch.device) -> bool:
    if src.type != dst.type:
        return False
    return dst.index is None or src.index is None or src.index == dst.index


def _copy(session: Session, tensor: torch.Tensor, dst: torch.device, non_blocking: bool,
          call: Any) -> Any:
    s = session
    src = tensor.device
    if _same(src, dst):
        return call()
    if dst.type == "cpu":  # device -> host: the CPU waits for the copy
        t0 = time.perf_counter()
        try:
            return call()
        finally:
            record(s, "to_cpu", time.perf_counter() - t0)
    if s.fwd_depth:  # a copy inside the model's forward is the model's business
        return call()
    if s.accelerator is None:
        s.accelerator = dst.type
    info = s.observations.get("transfers")
    if info is None:
        s.observe("transfers", "transfers", count=0, non_blocking=0, pinned=0, checked=0)
        info = s.observations["transfers"]
    info["count"] += 1
    info["non_blocking"] += int(bool(non_blocking))
    if info["checked"] < 64 and src.type == "cpu":
        info["checked"] += 1
        s.internal += 1
        try:
            info["pinned"] += int(tensor.is_pinned())
        except RuntimeError:
            pass
        finally:
            s.internal -= 1
    s.mon.begin("h2d")
    try:
        return call()
    finally:
        s.mon.end("h2d")


BATCH_BUILDERS = ("stack", "from_numpy", "randint", "randperm", "randn", "rand")
"""torch functions that build a batch in the main process (see module docstring)."""


def _make_builder(session: Session, original: Any) -> Any:
    def build(*args: Any, **kwargs: Any) -> Any:
        s = session
        if (not s.data_open and not s.fwd_depth and not s.bwd_depth and not s.opt_depth and not s.eval_open
                and not s.in_data and s.seen["forwards"] and s.on() and not called_from_torch(2)):
            s.open_data()
        return original(*args, **kwargs)

    build.__wrapped__ = original  # type: ignore[attr-defined]
    return build


def install(session: Session, patches: Patches) -> None:
    for name in BATCH_BUILDERS:
        patches.wrap(torch, name, lambda orig: _make_builder(session, orig))
    def make_to(original: Any) -> Any:
        def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            s = session
            if not s.on() or called_from_torch(2):
                return original(self, *args, **kwargs)
            dst = target_device(args, kwargs)
            if dst is None:
                return original(self, *args, **kwargs)
            non_blocking = bool(kwargs.get("non_blocking", False)) or any(
                a is True for a in args[1:3])
            return _copy(s, self, dst, non_blocking, lambda: original(self, *args, **kwargs))

        to.__wrapped__ = original  # type: ignore[attr-defined]
        return to

    def make_cuda(original: Any) -> Any:
        def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
            s = session
            if not s.on() or called_from_torch(2):
                return original(self, device, non_blocking, **kwargs)
            if isinstance(device, torch.device):
                dst = device
            elif device is None:
                dst = torch.device("cuda")
            else:
                dst = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
            return _copy(s, self, dst, non_blocking, lambda: original(self, device, non_blocking, **kwargs))

        cuda.__wrapped__ = original  # type: ignore[attr-defined]
        return cuda

    patches.wrap(torch.Tensor, "to", make_to)
    patches.wrap(torch.Tensor, "cuda", make_cuda)
