"""Logging hooks: time spent in print, TensorBoard's SummaryWriter and wandb is the "log" phase.

Each call's site is kept, so a finding can name the line that logs every step.
"""

from __future__ import annotations

import builtins
import time
from types import ModuleType
from typing import Any

from trainspeed.doctor.instrument.imports import PostImportHooks
from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.sites import caller_site_via

SUMMARY_WRITER_METHODS = (
    "add_scalar", "add_scalars", "add_histogram", "add_image", "add_images", "add_text",
    "add_figure", "add_hparams", "add_embedding", "add_audio", "add_pr_curve", "flush",
)
"""SummaryWriter calls a training loop makes (torch.utils.tensorboard and tensorboardX)."""


def _wrap(session: Session, kind: str, original: Any, library: str | None = None) -> Any:
    key = f"logger:{library}" if library else None

    def logged(*args: Any, **kwargs: Any) -> Any:
        s = session
        if not s.on():
            return original(*args, **kwargs)
        if key is not None and key not in s.observations:
            s.observe(key, "logger", library=library)  # used, not merely imported
        t0 = time.perf_counter()
        s.mon.begin("log")
        try:
            return original(*args, **kwargs)
        finally:
            s.mon.end("log")
            site, via = caller_site_via(2)
            s.sites.add("log", kind, site, time.perf_counter() - t0, via)

    logged.__wrapped__ = original  # type: ignore[attr-defined]
    return logged


def _patch_writer_class(session: Session, patches: Patches, cls: type, prefix: str) -> None:
    for name in SUMMARY_WRITER_METHODS:
        if name in cls.__dict__:
            patches.wrap(cls, name, lambda orig, name=name: _wrap(session, f"{prefix}.{name}", orig, prefix))


def install(session: Session, patches: Patches, imports: PostImportHooks) -> None:
    patches.wrap(builtins, "print", lambda orig: _wrap(session, "print", orig))

    def on_tb(module: ModuleType) -> None:
        cls = getattr(module, "SummaryWriter", None)
        if isinstance(cls, type):
            _patch_writer_class(session, patches, cls, "tensorboard")

    def on_tbx(module: ModuleType) -> None:
        cls = getattr(module, "SummaryWriter", None)
        if isinstance(cls, type):
            _patch_writer_class(session, patches, cls, "tensorboardX")

    def on_wandb(module: ModuleType) -> None:
        if callable(getattr(module, "log", None)):
            patches.wrap(module, "log", lambda orig: _wrap(session, "wandb.log", orig, "wandb"))

    def on_wandb_run(module: ModuleType) -> None:
        cls = getattr(module, "Run", None)
        if isinstance(cls, type) and "log" in cls.__dict__:
            patches.wrap(cls, "log", lambda orig: _wrap(session, "wandb.Run.log", orig, "wandb"))

    imports.add("torch.utils.tensorboard.writer", on_tb)
    imports.add("tensorboardX.writer", on_tbx)
    imports.add("wandb", on_wandb)
    imports.add("wandb.sdk.wandb_run", on_wandb_run)
