"""Package lookups inside the training steps: `importlib.util.find_spec` and the
`importlib.metadata` reads, called again at every step by a library's uncached availability
check.

Each lookup searches sys.path on disk (a stat per entry): 0.1 ms on the 2-core VM, more on a
long sys.path. accelerate 1.15's `AcceleratedOptimizer.step` asks `is_lomo_available()` twice
a call, and `optimizer.step()` runs once per micro-batch under `accelerator.accumulate`: two
lookups of 'lomo_optim' a micro-batch, most of what a small model's step spent outside its
phases. The fix is one line in the script (cache the check), which the finding writes out; to
write it, each lookup site's call chain is read once: the highest function in the library
that is an availability check its caller calls by a global name (`cache_target`).

Counted like the syncs (instrument/syncs.py): from the first step boundary on, not the
doctor's own calls; a lookup inside another (metadata.version calls distribution) is one.
"""

from __future__ import annotations

import importlib.metadata
import linecache
import importlib.util
import re
import sys
import time
from types import FrameType
from typing import Any

from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.sites import format_site, library_site
from trainspeed.patches.callers import _library, in_user_files
from trainspeed.patches.installed import installed_package

WRAPPED: tuple[tuple[Any, str], ...] = (
    (importlib.util, "find_spec"),
    (importlib.metadata, "version"),
    (importlib.metadata, "metadata"),
    (importlib.metadata, "distribution"),
)
"""(module, function): the lookups counted. Code that imported the function itself
(`from importlib.util import find_spec`) before the doctor started keeps the original."""

MAX_DEPTH = 40
"""Frames walked at most to read one site's call chain (once per site)."""

_CHECK_NAME = re.compile(r"^_*(is|has)_|available|installed|version", re.IGNORECASE)
"""Names of functions whose result may be cached: availability and version checks. A caching
line for any other function could change what the library does."""


def _package(filename: str) -> str:
    """The installed package a file lives in (or its folder): frames of one library."""
    return installed_package(filename) or filename.replace("\\", "/").rsplit("/", 1)[0]


def cache_target(frame: FrameType | None, depth: int = MAX_DEPTH) -> dict[str, Any] | None:
    """From the frame that called the lookup, upward: the outermost function of the same
    library that is an availability check (by its name) and that its caller reaches through a
    module global, as `from .utils import is_lomo_available` makes it. Caching that global
    in the caller's module (`accelerate.optimizer.is_lomo_available`) ends the lookups without
    touching the library's files. None when no such function exists (the script's own code,
    a method, a check reached through an attribute)."""
    if frame is None:
        return None
    package = _package(frame.f_code.co_filename)
    best = None
    while frame is not None and depth:
        caller = frame.f_back
        if caller is None or in_user_files((caller.f_code.co_filename, 0)) and not _library(caller.f_code.co_filename):
            break
        code = frame.f_code
        if _package(code.co_filename) != package:
            break
        module = caller.f_globals.get("__name__")
        function = caller.f_globals.get(code.co_name)
        if (getattr(function, "__code__", None) is code and isinstance(module, str) and module != "__main__"
                and _CHECK_NAME.search(code.co_name) and not code.co_argcount - len(function.__defaults__ or ())):
            best = {"module": module, "name": code.co_name, "defined": [code.co_filename, code.co_firstlineno]}
        frame, depth = caller, depth - 1
    return best


def _user_line(frame: FrameType | None, depth: int = MAX_DEPTH) -> dict[str, Any] | None:
    """The script's own frame the lookup ran under (`opt.step()` at train.py:25): its path,
    line, the site as reports show it and the code."""
    while frame is not None and depth:
        filename = frame.f_code.co_filename
        if not _library(filename) and in_user_files((filename, 0)):
            line = frame.f_lineno
            return {"path": [filename, line], "site": format_site(filename, line),
                    "code": linecache.getline(filename, line).strip()[:120]}
        frame, depth = frame.f_back, depth - 1
    return None


def _wrapper(session: Session, kind: str, original: Any) -> Any:
    busy = [False]  # a lookup running: the ones it makes itself are part of it

    def lookup(*args: Any, **kwargs: Any) -> Any:
        s = session
        if busy[0] or not s.on() or (s.primary_opt is None and s.boundary is None):
            return original(*args, **kwargs)
        busy[0] = True
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds = time.perf_counter() - t0
            busy[0] = False
            _record(s, kind, args[0] if args else kwargs.get("name") or kwargs.get("distribution_name"), seconds)

    lookup.__wrapped__ = original  # type: ignore[attr-defined]
    return lookup


def _record(session: Session, kind: str, name: Any, seconds: float) -> None:
    frame = sys._getframe(2)  # _record <- lookup <- lookup's caller (the library line)
    site = (frame.f_code.co_filename, frame.f_lineno)
    package = str(name)
    session.sites.add("lookup", package, site, seconds)
    key = f"package_lookup:{package}:{site[0]}:{site[1]}"
    if key not in session.observations:
        session.internal += 1
        try:
            session.observe(key, "package_lookup", package=package, call=f"{kind}({package!r})",
                            site=list(site), site_text=library_site(*site), function=frame.f_code.co_name,
                            cache=cache_target(frame), user_site=_user_line(frame))
        finally:
            session.internal -= 1


def install(session: Session, patches: Patches) -> None:
    for module, attr in WRAPPED:
        kind = f"{module.__name__}.{attr}"
        patches.wrap(module, attr, lambda orig, kind=kind: _wrapper(session, kind, orig))
