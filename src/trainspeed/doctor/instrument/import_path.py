"""Which PYTHONPATH entries the script's imports came from: a command the doctor suggests
afterwards must find the same modules, so it carries those entries (`PYTHONPATH=. trainspeed
tune -- python projects/adder/adder.py`, minGPT's layout) when the user typed them before the
doctor. Entries that only trainspeed itself came from (a source checkout's `src`), or that hold
nothing the script loaded (a cluster-wide setting), are left out: the user's shell has those
either way, and they would only lengthen every command."""

from __future__ import annotations

import os
import sys

__all__ = ["needed_pythonpath"]


def needed_pythonpath(script_dir: str | None = None) -> str | None:
    """The PYTHONPATH entries, as written in the environment, from which a loaded module came
    (trainspeed's own package and the script's own directory aside), joined; None when none."""
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    if not entries:
        return None
    own = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)) + os.sep  # trainspeed/
    files = [f for m in list(sys.modules.values())
             if isinstance(f := getattr(m, "__file__", None), str) and not f.startswith(own)]
    skip = os.path.abspath(script_dir) if script_dir else None
    needed = []
    for entry in entries:
        root = os.path.abspath(entry)
        if root == skip:
            continue
        prefix = root.rstrip(os.sep) + os.sep
        if any(f.startswith(prefix) for f in files):
            needed.append(entry)
    return os.pathsep.join(needed) or None

