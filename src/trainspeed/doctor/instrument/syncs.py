"""Host syncs: calls that make the CPU wait for the device (or read a result back).

Counted with `Monitor.count_sync()` per step; each call's site (file:line) and time spent are
kept for the report. What counts:

- tensor reads: `.item()`, `.tolist()`, `.numpy()`, `.cpu()`, `float(t)`, `int(t)`, `bool(t)`
  on a tensor that lives on an accelerator. In a CPU-only run nothing is a device sync, but
  the same line will be one on a GPU, so reads of tensors computed by the script (not the
  batch tensors the DataLoader produced) are counted as "would-be syncs";
- a torch.distributions argument check (`if not valid.all()` in `Categorical(probs)`,
  `m.log_prob(a)`), kind "validate_args";
- `torch.cuda.synchronize`, `torch.cuda.empty_cache`, `gc.collect`: always (the last two also
  have their own check, "cache/gc in the loop").

Not counted: calls from torch internals (Adam's step counter, GradScaler, collate), calls
made while the DataLoader produces a batch, setup before the first optimizer step, and
anything the doctor does itself.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from typing import Any

import torch

from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.sites import called_from_internals, caller_site_via

TENSOR_READS: tuple[tuple[str, str], ...] = (
    ("item", "item"),
    ("tolist", "tolist"),
    ("numpy", "numpy"),
    ("cpu", "cpu"),
    ("__float__", "float"),
    ("__int__", "int"),
    ("__bool__", "bool"),
)
"""(Tensor attribute, kind reported)."""

CACHE_GC_KINDS = ("empty_cache", "gc_collect")

DISTRIBUTIONS_DIR = os.path.join(os.path.dirname(torch.__file__), "distributions") + os.sep
"""A `bool(tensor)` whose direct caller lies here is a distribution's argument check
(`Distribution(validate_args=True)`, the default): `Categorical(probs)` and `m.log_prob(action)`
read a tensor each, every call. Counted as kind "validate_args": one keyword removes them."""


def _caller_file(depth: int) -> str:
    try:
        return sys._getframe(depth + 1).f_code.co_filename
    except ValueError:
        return ""


def counts_as_sync(session: Session, tensor: torch.Tensor) -> bool:
    """Does reading `tensor` on the host wait for a device (or would it, on a GPU)?"""
    device = tensor.device.type
    if device != "cpu":
        return device != "meta"
    if session.accelerator not in (None, "cpu"):
        return False  # a CPU tensor in a GPU run: reading it waits for nothing
    return id(tensor) not in session.batch_ids


def record(session: Session, kind: str, seconds: float) -> None:
    """Count one sync in the current step and remember where it came from. Reads during
    setup (before the first step boundary: building a dataset, loading weights) are not
    part of the training loop and are not counted. The first boundary is an optimizer step,
    a trainspeed.step() mark, or, in a loop without torch.optim (manual SGD), the forward
    after the first backward: gating on the optimizer alone counted nothing in such loops."""
    if session.primary_opt is None and session.boundary is None:
        return
    session.mon.count_sync()
    # frames: record <- wrapper <- caller
    site, via = caller_site_via(3)
    if kind == "bool" and _caller_file(2).startswith(DISTRIBUTIONS_DIR):
        kind = "validate_args"  # a distribution checking its arguments: `if not valid.all()`
    session.sites.add("sync", kind, site, seconds, via)


def _tensor_wrapper(session: Session, kind: str, original: Any) -> Any:
    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        s = session
        if not s.on() or s.in_data or called_from_internals(2) or not counts_as_sync(s, self):
            return original(self, *args, **kwargs)
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            record(s, kind, time.perf_counter() - t0)

    read.__wrapped__ = original  # type: ignore[attr-defined]
    return read


def _function_wrapper(session: Session, kind: str, original: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        s = session
        if not s.on() or called_from_internals(2):
            return original(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            record(s, kind, time.perf_counter() - t0)

    call.__wrapped__ = original  # type: ignore[attr-defined]
    return call


def install(session: Session, patches: Patches) -> None:
    for attr, kind in TENSOR_READS:
        patches.wrap(torch.Tensor, attr, lambda orig, kind=kind: _tensor_wrapper(session, kind, orig))
    patches.wrap(torch.cuda, "synchronize", lambda orig: _function_wrapper(session, "synchronize", orig))
    patches.wrap(torch.cuda, "empty_cache", lambda orig: _function_wrapper(session, "empty_cache", orig))
    patches.wrap(gc, "collect", lambda orig: _function_wrapper(session, "gc_collect", orig))
