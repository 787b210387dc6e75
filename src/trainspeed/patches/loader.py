"""Settings of the training loop's DataLoader: num_workers, pin_memory, persistent_workers,
prefetch_factor. One wrapper of `DataLoader.__init__` serves all four: a loader built at the
training loader's site (the doctor recorded it) gets the settings as keyword arguments; every
other loader (validation, a test loader) is left as the script wrote it. Without a recorded
site, every loader built in the user's own files gets them (and a note says so).
"""

from __future__ import annotations

import os
from typing import Any

from torch.utils.data import DataLoader

from trainspeed.patches.callers import chosen_site
from trainspeed.patches.context import InstallContext

_NEEDS_WORKERS = ("persistent_workers", "prefetch_factor")


def _describe(site: tuple[str, int]) -> str:
    return f"{os.path.basename(site[0])}:{site[1]}"


def _ensure_installed(ctx: InstallContext) -> dict[str, Any]:
    overrides = ctx.shared.get("loader")
    if overrides is not None:
        return overrides
    overrides = ctx.shared["loader"] = {}
    target = ctx.targets.loader_site
    original = DataLoader.__init__
    reported: set[tuple[str, int]] = set()

    def __init__(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        site = chosen_site(target)
        if site is None:
            return original(self, *args, **kwargs)
        if len(args) > 5:  # num_workers and later given by position (rare): leave the call alone
            ctx.note(f"DataLoader at {_describe(site)}: its settings are positional arguments; not changed")
            return original(self, *args, **kwargs)
        kw = {**kwargs, **overrides}
        skipped = []
        if not kw.get("num_workers"):
            # DataLoader raises for these without workers, the script's own values included
            # (its persistent_workers=True next to our num_workers=0)
            for key in _NEEDS_WORKERS:
                if kw.get(key) not in (None, False) or key in overrides:
                    kw.pop(key, None)
                    skipped.append(key)
        if site not in reported:
            reported.add(site)
            applied = ", ".join(f"{k}={v!r}" for k, v in overrides.items() if k not in skipped)
            ctx.note(f"DataLoader at {_describe(site)}: {applied or 'unchanged'}"
                     + (f"; {', '.join(skipped)} skipped (needs num_workers > 0)" if skipped else ""))
        original(self, *args, **kw)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    ctx.patches.setattr(DataLoader, "__init__", __init__)
    if target is None:
        ctx.note("no training DataLoader site recorded: loader settings apply to every DataLoader built in your files")
    return overrides


def _install(key: str, value: Any, ctx: InstallContext) -> None:
    _ensure_installed(ctx)[key] = value


def install_num_workers(value: int, ctx: InstallContext) -> None:
    _install("num_workers", value, ctx)


def install_pin_memory(value: bool, ctx: InstallContext) -> None:
    _install("pin_memory", value, ctx)


def install_persistent_workers(value: bool, ctx: InstallContext) -> None:
    _install("persistent_workers", value, ctx)


def install_prefetch_factor(value: int, ctx: InstallContext) -> None:
    _install("prefetch_factor", value, ctx)
