"""Which files belong to installed packages, and which package: the one rule every part of the
doctor and the patches reads the user's code by.

A file is an installed package's when it lies under site-packages or dist-packages (a venv,
conda, a system Python), or under a `sys.path` folder that holds installed distributions: a
`*.dist-info` folder (`pip install --target deps` with `PYTHONPATH=deps`), or an `*.egg-info`
folder outside the script's folder and the working directory (a library's checkout installed
with `pip install -e`, found through its `.pth` entry). The user's own project installed that
way lies in or under the working directory and stays the user's; so do folders a script adds
to `sys.path` for its own helpers, which hold no such metadata.
"""

from __future__ import annotations

import os
import sys

MARKERS = ("site-packages", "dist-packages")

_cache: dict[str, object] = {"key": None, "roots": ()}


def _holds(folder: str, suffix: str) -> bool:
    try:
        return any(name.endswith(suffix) for name in os.listdir(folder))
    except OSError:
        return False


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def install_roots(path: list[str] | None = None, cwd: str | None = None) -> tuple[str, ...]:
    """The `sys.path` folders (or `path`'s) that hold installed distributions, each ending in
    the path separator; site-packages/dist-packages ones are left to the marker test."""
    entries = sys.path if path is None else path
    here = os.path.realpath(cwd or os.getcwd())
    script = os.path.realpath(os.path.dirname(os.path.abspath(sys.argv[0]))) if sys.argv and sys.argv[0] else here
    roots = []
    for entry in entries:
        if not entry or not os.path.isdir(entry) or any(m in entry for m in MARKERS):
            continue
        real = os.path.realpath(entry)
        own = _inside(real, here) or _inside(real, script)
        if _holds(real, ".dist-info") or (not own and _holds(real, ".egg-info")):
            roots.append(os.path.abspath(entry).rstrip(os.sep) + os.sep)
            if real != os.path.abspath(entry):
                roots.append(real.rstrip(os.sep) + os.sep)
    return tuple(roots)


def _roots() -> tuple[str, ...]:
    # sys.path changes while a script runs (its own inserts); the key notices the usual ones
    # (insert at the front, append) without comparing the whole list at every call.
    key = (len(sys.path), sys.path[0] if sys.path else None, sys.path[-1] if sys.path else None)
    if _cache["key"] != key:
        _cache["key"], _cache["roots"] = key, install_roots()
    return _cache["roots"]  # type: ignore[return-value]


def installed_root(filename: str) -> str | None:
    """The folder of installed packages `filename` lies in (`.../site-packages/`), or None
    when it is the user's own file."""
    for marker in MARKERS:
        head, sep, _ = filename.replace("\\", "/").partition(f"/{marker}/")
        if sep:
            return head + sep
    roots = _roots()
    if roots and filename.startswith(roots):
        return next(root for root in roots if filename.startswith(root))
    return None


def is_installed(filename: str) -> bool:
    """Does `filename` belong to an installed package (not the user's own code)?"""
    if "site-packages" in filename or "dist-packages" in filename:
        return True
    roots = _roots()
    return bool(roots) and filename.startswith(roots)


def installed_package(filename: str) -> str | None:
    """The top folder of the installed package `filename` lies in (`transformers`), or None."""
    root = installed_root(filename)
    if root is None:
        return None
    return filename.replace("\\", "/")[len(root.replace("\\", "/")):].split("/", 1)[0] or None


def installed_path(filename: str) -> str | None:
    """`transformers/modeling_utils.py`: the file's path inside its packages folder, or None."""
    root = installed_root(filename)
    return filename.replace("\\", "/")[len(root.replace("\\", "/")):] if root is not None else None


__all__ = ["MARKERS", "install_roots", "installed_package", "installed_path", "installed_root", "is_installed"]
