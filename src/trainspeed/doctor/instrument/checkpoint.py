"""Checkpoint hooks: `torch.save` is the "ckpt" phase; each save becomes a "checkpoint" event
(path, seconds, bytes) so the checks can tell "too often" from "too slow"."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.sites import caller_site

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


def install(session: Session, patches: Patches) -> None:
    def make_save(original: Any) -> Any:
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            s = session
            if not s.on():
                return original(obj, f, *args, **kwargs)
            t0 = time.perf_counter()
            s.mon.begin("ckpt")
            try:
                return original(obj, f, *args, **kwargs)
            finally:
                s.mon.end("ckpt")
                seconds = time.perf_counter() - t0
                shown, path = _describe_target(f)
                size = None
                if path is not None:
                    try:
                        size = os.path.getsize(path)
                    except OSError:
                        pass
                    if len(s.checkpoint_paths) < MAX_PATHS:
                        s.checkpoint_paths.add(os.path.abspath(path))
                site = caller_site(2)
                s.sites.add("ckpt", "torch.save", site, seconds)
                s.internal += 1
                try:
                    s.mon.event("checkpoint", path=shown, seconds=seconds, bytes=size,
                                source="torch.save")
                finally:
                    s.internal -= 1

        save.__wrapped__ = original  # type: ignore[attr-defined]
        return save

    patches.wrap(torch, "save", make_save)
