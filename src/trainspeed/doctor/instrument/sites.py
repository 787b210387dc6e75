"""Call sites in the user's code: which line of train.py issued a sync, a print, a save.

A hook fires deep inside torch; the useful answer is the innermost frame outside torch,
trainspeed and the standard library: the user's line, or the Lightning/transformers line that
made the call (that is where the sync really comes from). A call made inside a package the
script hands its whole step to (DeepSpeed: `engine.backward`, `engine.step`,
`engine.save_checkpoint`) is the user's line that called into it, with the package's line kept
beside it (`via`), and such a package's own syncs are internals like torch's.
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

import trainspeed
from trainspeed.patches.callers import delegated_caller, in_delegating
from trainspeed.patches.installed import installed_package, installed_path

TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
"""Calls whose direct caller lives here are torch internals (e.g. Adam's step counter
`.item()`), not something the user can change; hooks ignore them."""

_TRAINSPEED_DIR = os.path.dirname(trainspeed.__file__) + os.sep
MAX_DEPTH = 60
"""Frames walked at most per lookup (bounds the cost of one hook call)."""
MAX_SITES = 2000
"""Distinct sites remembered; beyond this new sites are folded into "<other>"."""


# Direct callers in these torch packages are internals the user does not write: Adam's
# step-counter `.item()`, GradScaler's inf check, default_collate, compiler passes.
_IGNORED_CALLERS = tuple(
    TORCH_DIR + sub + os.sep
    for sub in ("optim", "amp", os.path.join("cuda", "amp"), os.path.join("utils", "data"), "_dynamo",
                "_inductor", "fx", "_subclasses", "profiler", "_functorch", "distributed",
                os.path.join("nn", "modules"), os.path.join("utils", "flop_counter.py"))
)


def caller_site(start: int = 2) -> tuple[str, int] | None:
    """(filename, lineno) of the innermost frame, from `start` frames up, that is not torch,
    trainspeed or the standard library: the user's line, or the library line (Lightning,
    transformers) that made the call. The same rule the run-time settings match sites by.
    Inside a delegating package (DeepSpeed) it is the user's line that called into it."""
    return delegated_caller(start + 1, MAX_DEPTH)[0]


def caller_site_via(start: int = 2) -> tuple[tuple[str, int] | None, tuple[str, int] | None]:
    """(site, via): `caller_site`, and the delegating package's line the call went through
    (None when it went through none)."""
    return delegated_caller(start + 1, MAX_DEPTH)


def called_from_torch(depth: int = 2) -> bool:
    """True when the function `depth` frames up was called by torch's own code."""
    try:
        return sys._getframe(depth).f_code.co_filename.startswith(TORCH_DIR)
    except ValueError:
        return False


def called_from_internals(depth: int = 2) -> bool:
    """True when the direct caller is a torch internal listed in _IGNORED_CALLERS, trainspeed
    itself, or a delegating package (DeepSpeed's step reads its overflow flag and gradient
    norm): such syncs are not the user's to remove."""
    try:
        filename = sys._getframe(depth).f_code.co_filename
    except ValueError:
        return False
    return filename.startswith(_IGNORED_CALLERS) or filename.startswith(_TRAINSPEED_DIR) or in_delegating(filename)


def format_site(filename: str, lineno: int) -> str:
    """`train.py:42` (relative to the cwd when inside it)."""
    try:
        rel = os.path.relpath(filename)
        shown = rel if not rel.startswith("..") else filename
    except ValueError:
        shown = filename
    return f"{shown}:{lineno}"


def library_site(filename: str, lineno: int) -> str:
    """`deepspeed/runtime/engine.py:2203`: an installed package's line, from its package folder."""
    inside = installed_path(filename)
    return f"{inside}:{lineno}" if inside is not None else format_site(filename, lineno)


@dataclass(slots=True)
class SiteStat:
    count: int = 0
    seconds: float = 0.0
    via: tuple[str, int] | None = None
    """The delegating package's line the calls went through (the first one seen)."""
    library: str | None = None
    """The installed package the site lies in, read when it is first seen: the script's own
    sys.path (a --target folder it was given) is gone by the time the rows are written."""


@dataclass(slots=True)
class SiteCounter:
    """Counts (category, kind, filename, lineno) -> calls and seconds; bounded by MAX_SITES."""

    stats: dict[tuple[str, str, str, int], SiteStat] = field(default_factory=dict)

    def add(self, category: str, kind: str, where: tuple[str, int] | None, seconds: float = 0.0,
            via: tuple[str, int] | None = None) -> None:
        filename, lineno = where if where is not None else ("<unknown>", 0)
        key = (category, kind, filename, lineno)
        stat = self.stats.get(key)
        if stat is None:
            if len(self.stats) >= MAX_SITES:
                key = (category, kind, "<other>", 0)
                stat = self.stats.get(key)
            if stat is None:
                stat = self.stats[key] = SiteStat(library=installed_package(key[2]) if key[3] else None)
        if stat.via is None and via is not None:
            stat.via = via
        stat.count += 1
        stat.seconds += seconds

    def totals(self, category: str) -> dict[str, SiteStat]:
        """Per kind totals of one category."""
        out: dict[str, SiteStat] = {}
        for (cat, kind, _, _), stat in self.stats.items():
            if cat == category:
                total = out.setdefault(kind, SiteStat())
                total.count += stat.count
                total.seconds += stat.seconds
        return out

    def top(self, limit_per_category: int = 10) -> list[dict[str, Any]]:
        """The busiest sites per category, as plain dicts for an event record."""
        rows: list[dict[str, Any]] = []
        categories = sorted({key[0] for key in self.stats})
        for category in categories:
            items = [(k, s) for k, s in self.stats.items() if k[0] == category]
            items.sort(key=lambda kv: (-kv[1].count, -kv[1].seconds))
            for (cat, kind, filename, lineno), stat in items[:limit_per_category]:
                code = linecache.getline(filename, lineno).strip() if lineno else ""
                row = {
                    "category": cat,
                    "kind": kind,
                    "site": format_site(filename, lineno) if lineno else filename,
                    "site_path": [filename, lineno] if lineno else None,
                    "code": code[:160],
                    "count": stat.count,
                    "seconds": stat.seconds,
                }
                if stat.library is not None:
                    row["library"] = stat.library
                if stat.via is not None:
                    row["via"] = library_site(*stat.via)
                    row["via_code"] = linecache.getline(*stat.via).strip()[:160]
                rows.append(row)
        return rows
