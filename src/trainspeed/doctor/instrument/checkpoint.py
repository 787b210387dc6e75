"""Checkpoint hooks: `torch.save` is the "ckpt" phase; each save becomes a "checkpoint" event
(path, seconds, bytes) so the checks can tell "too often" from "too slow".

A framework's own save call (DeepSpeed's `engine.save_checkpoint`, see deepspeed.py) writes
several files through torch.save; `save_call` makes that call the one checkpoint: the files
written inside it add their bytes to it and are not separate saves, and its site is the
user's line that called it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.sites import caller_site_via

MAX_PATHS = 10_000
"""Distinct checkpoint paths remembered (to count the files a run leaves behind)."""


def _describe_target(f: Any) -> tuple[str, str | None]:
    """(shown name, file path or None) of torch.save's destination."""
    if isinstance(f, (str, os.PathLike)):
        path = os.fspath(f)
        return path, path
    name = getattr(f, "name", None)
    if isinstance(name, str):
        return name, name
    return f"<{type(f).__name__}>", None


def _file_size(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def _remember(session: Session, path: str | None) -> None:
    if path is not None and len(session.checkpoint_paths) < MAX_PATHS:
        session.checkpoint_paths.add(os.path.abspath(path))


def _record(session: Session, *, kind: str, shown: str, seconds: float, size: int | None,
            files: int | None = None, called: tuple[str, int] | None = None) -> None:
    # frames: _record <- wrapper <- caller
    site, via = caller_site_via(3)
    session.sites.add("ckpt", kind, site, seconds, via or called)
    session.internal += 1
    try:
        extra = {"files": files} if files is not None else {}
        session.mon.event("checkpoint", path=shown, seconds=seconds, bytes=size, source=kind, **extra)
    finally:
        session.internal -= 1


def save_call(session: Session, kind: str, original: Any, target: Any = None) -> Any:
    """Wrap a framework's checkpoint call (`kind`, e.g. "deepspeed.save_checkpoint"): the
    "ckpt" phase, one checkpoint event with the bytes and number of the files it wrote,
    named by the user's line, with the wrapped function's own line beside it. `target(args,
    kwargs)` gives the shown destination."""
    code = getattr(original, "__code__", None)
    called = (code.co_filename, code.co_firstlineno) if code is not None else None

    def call(*args: Any, **kwargs: Any) -> Any:
        s = session
        if not s.on() or s.ckpt_call is not None:
            return original(*args, **kwargs)
        t0 = time.perf_counter()
        s.ckpt_call = [0, 0]  # files, bytes written through torch.save inside the call
        s.mon.begin("ckpt")
        try:
            return original(*args, **kwargs)
        finally:
            files, size = s.ckpt_call
            s.ckpt_call = None
            s.mon.end("ckpt")
            shown = "?"
            try:
                shown = str(target(args, kwargs)) if target is not None else kind
            except Exception:  # noqa: BLE001 - the name is cosmetic
                pass
            _record(s, kind=kind, shown=shown, seconds=time.perf_counter() - t0,
                    size=size if files else None, files=files, called=called)

    call.__wrapped__ = original  # type: ignore[attr-defined]
    return call


def install(session: Session, patches: Patches) -> None:
    def make_save(original: Any) -> Any:
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            s = session
            if not s.on():
                return original(obj, f, *args, **kwargs)
            if s.ckpt_call is not None:  # a file of a framework's checkpoint (save_call)
                try:
                    return original(obj, f, *args, **kwargs)
                finally:
                    _, path = _describe_target(f)
                    _remember(s, path)
                    s.ckpt_call[0] += 1
                    s.ckpt_call[1] += _file_size(path) or 0
            t0 = time.perf_counter()
            s.mon.begin("ckpt")
            try:
                return original(obj, f, *args, **kwargs)
            finally:
                s.mon.end("ckpt")
                seconds = time.perf_counter() - t0
                shown, path = _describe_target(f)
                _remember(s, path)
                _record(s, kind="torch.save", shown=shown, seconds=seconds, size=_file_size(path))

        save.__wrapped__ = original  # type: ignore[attr-defined]
        return save

    patches.wrap(torch, "save", make_save)
