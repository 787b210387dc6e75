"""What-ifs: measure what a finding costs by thinning or removing it. They change what the
script does (fewer log records, fewer checkpoints, no gc.collect), so the tuner reports them as
"what this costs here" and never keeps them; the user keeps the gain by changing the interval
in their own code. Calls are counted per call site (file:line), so a loop that logs five
scalars per step keeps every k-th step of each.
"""

from __future__ import annotations

import builtins
import gc
import sys
from collections import Counter
from types import ModuleType
from typing import Any, Callable

import torch

from trainspeed.patches.callers import in_user_files, user_caller
from trainspeed.patches.context import InstallContext

WRITER_METHODS = ("add_scalar", "add_scalars", "add_histogram", "add_image", "add_images", "add_text",
                  "add_figure", "flush")


def _every_kth(k: int, original: Callable[..., Any], counts: Counter, skipped_value: Any = None,
               user_files: bool = False, tagged: bool = False) -> Callable[..., Any]:
    """Every k-th call per call site runs (per site and tag with `tagged`: a loop that writes
    one histogram per parameter from one line keeps every k-th step of each). Calls from torch
    or trainspeed always run; with `user_files`, so do calls from installed packages (print and
    torch.save from the script's own files only: a library's checkpoint bookkeeping must not
    lose files it wrote)."""
    def thinned(*args: Any, **kwargs: Any) -> Any:
        site = user_caller(2)
        if site is None or (user_files and not in_user_files(site)):
            return original(*args, **kwargs)
        key: Any = site
        if tagged:  # SummaryWriter.add_*(self, tag, ...)
            tag = args[1] if len(args) > 1 else kwargs.get("tag", kwargs.get("main_tag"))
            key = (site, tag if isinstance(tag, str) else None)
        counts[key] += 1
        if (counts[key] - 1) % k == 0:
            return original(*args, **kwargs)
        return skipped_value

    thinned.__wrapped__ = original  # type: ignore[attr-defined]
    return thinned


def install_log_every(k: int, ctx: InstallContext) -> None:
    counts: Counter = Counter()
    thinned_print = _every_kth(k, builtins.print, counts, user_files=True)
    original_print = builtins.print

    def print_(*args: Any, **kwargs: Any) -> Any:
        # Only the script's stdout logging: trainspeed's own messages go to stderr.
        if kwargs.get("file") not in (None, sys.stdout):
            return original_print(*args, **kwargs)
        return thinned_print(*args, **kwargs)

    ctx.patches.setattr(builtins, "print", print_)

    def writer(module: ModuleType) -> None:
        cls = getattr(module, "SummaryWriter", None)
        for name in WRITER_METHODS:
            if isinstance(cls, type) and name in cls.__dict__:
                ctx.patches.setattr(cls, name, _every_kth(k, cls.__dict__[name], counts, tagged=name != "flush"))

    def wandb(module: ModuleType) -> None:
        # The calls that run are passed through as made (commit=False, step=...), so a step
        # logged from two lines, commit=False then commit=True, stays one step.
        if callable(getattr(module, "log", None)):
            ctx.patches.setattr(module, "log", _every_kth(k, module.log, counts))

    def wandb_run(module: ModuleType) -> None:
        # run.log(...) from the script's own files; wandb.log reaches Run.log from wandb's
        # files and was thinned already above (thinning it twice would keep 1 in k*k)
        cls = getattr(module, "Run", None)
        if isinstance(cls, type) and "log" in cls.__dict__:
            ctx.patches.setattr(cls, "log", _every_kth(k, cls.__dict__["log"], counts, user_files=True))

    ctx.imports.add("torch.utils.tensorboard.writer", writer)
    ctx.imports.add("tensorboardX.writer", writer)
    ctx.imports.add("wandb", wandb)
    ctx.imports.add("wandb.sdk.wandb_run", wandb_run)
    ctx.note(f"what-if: print, SummaryWriter and wandb.log calls run once every {k} calls per call site "
             "(and per tag for SummaryWriter)")


def install_save_every(k: int, ctx: InstallContext) -> None:
    ctx.patches.setattr(torch, "save", _every_kth(k, torch.save, Counter(), user_files=True))
    ctx.note(f"what-if: torch.save from the script writes once every {k} calls per call site")


def install_gc_every(k: int, ctx: InstallContext) -> None:
    """gc.collect / torch.cuda.empty_cache from the script's own files run once every k calls
    per call site: what moving a per-step call under `if step % k == 0:` does (whatif_code.py)."""
    ctx.patches.setattr(gc, "collect", _every_kth(k, gc.collect, Counter(), skipped_value=0, user_files=True))
    ctx.patches.setattr(torch.cuda, "empty_cache", _every_kth(k, torch.cuda.empty_cache, Counter(), user_files=True))
    ctx.note(f"what-if: gc.collect and torch.cuda.empty_cache from the script run once every {k} calls per call site")


def install_no_gc(value: bool, ctx: InstallContext) -> None:
    if not value:
        return

    def skip(original: Callable[..., Any]) -> Callable[..., Any]:
        def noop(*args: Any, **kwargs: Any) -> Any:
            if not in_user_files(user_caller(2)):  # a library's own gc.collect still runs
                return original(*args, **kwargs)
            return 0

        noop.__wrapped__ = original  # type: ignore[attr-defined]
        return noop

    ctx.patches.setattr(gc, "collect", skip(gc.collect))
    ctx.patches.setattr(torch.cuda, "empty_cache", skip(torch.cuda.empty_cache))
    ctx.note("what-if: gc.collect and torch.cuda.empty_cache from the script do nothing")
