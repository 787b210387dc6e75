"""Which line of the user's code made a call: the innermost frame outside torch, trainspeed
and the standard library. A patch that must change one DataLoader or one optimizer (the
training loop's) matches that line against the site the doctor recorded."""

from __future__ import annotations

import os
import sys
import sysconfig

import torch

import trainspeed
from trainspeed.patches.installed import is_installed

_TORCH = os.path.dirname(torch.__file__) + os.sep
_OURS = os.path.dirname(trainspeed.__file__) + os.sep
# The standard library proper. Not sysconfig's "platstdlib": inside a virtualenv that is
# `<venv>/lib/pythonX.Y`, a prefix of site-packages, and would hide every Lightning or
# transformers frame.
_STDLIB = tuple({os.path.dirname(os.__file__) + os.sep, (sysconfig.get_paths().get("stdlib") or "") + os.sep} - {os.sep})


def _library(filename: str) -> bool:
    # A third-party package that happens to live under the stdlib tree (a system Python's
    # site-packages or dist-packages) is library code the user runs, not the stdlib.
    if filename.startswith(("<frozen", _TORCH, _OURS)):
        return True
    return filename.startswith(_STDLIB) and not is_installed(filename)


def user_caller(start: int = 2, depth: int = 60) -> tuple[str, int] | None:
    """(filename, line) of the first frame from `start` up that is not torch, trainspeed or
    the standard library (the user's line, or a library's such as Lightning's)."""
    try:
        frame = sys._getframe(start)
    except ValueError:
        return None
    while frame is not None and depth:
        if not _library(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_lineno
        frame, depth = frame.f_back, depth - 1
    return None


DELEGATING = ("deepspeed",)
"""Packages a script hands its whole step to (`engine.backward`, `engine.step`,
`engine.save_checkpoint`): a call made inside one is the user's line that called into it, with
the package's own line beside it (`delegated_caller`)."""


def _delegating_dirs() -> tuple[str, ...]:
    """Source folders of the DELEGATING packages imported so far (none imported: nothing to do)."""
    dirs = []
    for name in DELEGATING:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None) if module is not None else None
        if path:
            dirs.append(os.path.dirname(path) + os.sep)
    return tuple(dirs)


def in_delegating(filename: str) -> bool:
    """Is `filename` part of a DELEGATING package (DeepSpeed's runtime, say)?"""
    dirs = _delegating_dirs()
    return bool(dirs) and filename.startswith(dirs)


def delegated_caller(start: int = 2, depth: int = 60) -> tuple[tuple[str, int] | None, tuple[str, int] | None]:
    """(site, via): `user_caller`'s frame, except that a frame inside a DELEGATING package is
    `via` and the site is the first frame further out that is neither library code nor that
    package: `engine.save_checkpoint(...)` in train.py for a torch.save deep inside DeepSpeed.
    `via` is None when the call did not pass through such a package."""
    try:
        frame = sys._getframe(start)
    except ValueError:
        return None, None
    dirs = _delegating_dirs()
    via = None
    while frame is not None and depth:
        filename = frame.f_code.co_filename
        if not _library(filename):
            if not (dirs and filename.startswith(dirs)):
                return (filename, frame.f_lineno), via
            if via is None:
                via = (filename, frame.f_lineno)
        frame, depth = frame.f_back, depth - 1
    return via, None  # no frame outside the package (a thread it started): its own line


def user_sites(start: int = 2, depth: int = 60) -> list[tuple[str, int]]:
    """Every non-library frame's (filename, line), innermost first: a DataLoader or optimizer
    subclass's `super().__init__` line comes first, the line that built it further out."""
    try:
        frame = sys._getframe(start)
    except ValueError:
        return []
    out = []
    while frame is not None and depth:
        if not _library(frame.f_code.co_filename):
            out.append((frame.f_code.co_filename, frame.f_lineno))
        frame, depth = frame.f_back, depth - 1
    return out


def chosen_site(target: tuple[str, int] | None, start: int = 3) -> tuple[str, int] | None:
    """chosen_among for one recorded target, or none."""
    return chosen_among((target,) if target is not None else (), start + 1)  # one frame more: this one


def chosen_among(targets: tuple[tuple[str, int], ...], start: int = 3) -> tuple[str, int] | None:
    """The site a patched constructor applies at, or None: with recorded targets (a GAN's two
    optimizers), the frame at any of their lines (anywhere up the user's stack); without any,
    the innermost user frame when it is in the user's own files (not an installed package)."""
    sites = user_sites(start)
    if not targets:
        return sites[0] if sites and in_user_files(sites[0]) else None
    return next((site for site in sites if any(same_site(site, t) for t in targets)), None)


def in_user_files(site: tuple[str, int] | None) -> bool:
    """A call made from the user's own files (not an installed package: `patches.installed`)."""
    return site is not None and not is_installed(site[0])


def same_site(a: tuple[str, int] | None, b: tuple[str, int] | None) -> bool:
    return a is not None and b is not None and a[1] == b[1] and os.path.realpath(a[0]) == os.path.realpath(b[0])


__all__ = ["DELEGATING", "chosen_among", "chosen_site", "delegated_caller", "in_delegating", "in_user_files", "same_site",
           "user_caller", "user_sites"]
