"""Which PYTHONPATH entries the script's imports came from: a command the doctor suggests
afterwards must find the same modules, so it carries those entries (`PYTHONPATH=. trainspeed
tune -- python projects/adder/adder.py`, minGPT's layout) when the user typed them before the
doctor. Entries that only trainspeed itself came from (a source checkout's `src`), or that hold
nothing the script loaded (a cluster-wide setting), are left out: the user's shell has those
either way, and they would only lengthen every command."""

from __future__ import annotations

import os
import sys

__all__ = ["TRAINSPEED_ROOT", "needed_pythonpath", "own_pythonpath", "prefixed", "with_own_env"]

_OWN_PACKAGE = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))  # .../trainspeed
TRAINSPEED_ROOT = os.path.dirname(_OWN_PACKAGE)
"""The folder this trainspeed is imported from (a checkout's `src`, or site-packages): what a
relaunch puts first on each process's path so that it imports the same trainspeed."""


def _entries() -> list[str]:
    return [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]


def own_pythonpath() -> str | None:
    """This process's PYTHONPATH entries, as written, but the one trainspeed itself came from (a
    source checkout's `src`): what a command that reruns the same script the same way carries
    (the tune's `run --with` and resume commands, where the script's imports are not seen)."""
    return os.pathsep.join(e for e in _entries() if os.path.abspath(e) != TRAINSPEED_ROOT) or None


def prefixed(command: str, *entries: str | None, env: dict[str, str] | None = None) -> str:
    """`command` run with these PYTHONPATH entries first (`PYTHONPATH=. trainspeed ...`) and the
    variables of `env` the script ran with (instrument/run_env.py), all sorted by name."""
    from trainspeed.doctor.instrument.run_env import assignments

    joined = os.pathsep.join(e for e in entries if e)
    env = {k: v for k, v in (env or {}).items() if k != "PYTHONPATH"}
    return assignments({**env, **({"PYTHONPATH": joined} if joined else {})}) + command


def with_own_env(command: str) -> str:
    """`command` run as this process was: its PYTHONPATH entries (own_pythonpath) and the
    variables that change how torch or the script runs (run_env.carried_env). For the tune's
    printed commands, which rerun the script its trials ran."""
    from trainspeed.doctor.instrument.run_env import carried_env

    return prefixed(command, own_pythonpath(), env=carried_env())


def needed_pythonpath(script_dir: str | None = None) -> str | None:
    """The PYTHONPATH entries, as written in the environment, from which a loaded module came
    (trainspeed's own package and the script's own directory aside), joined; None when none."""
    entries = _entries()
    if not entries:
        return None
    own = _OWN_PACKAGE + os.sep
    files = [f for m in list(sys.modules.values())
             if isinstance(f := getattr(m, "__file__", None), str) and not f.startswith(own)]
    # the script's own directory is on the path anyway; trainspeed's parent (a relaunch under
    # accelerate or torchrun puts it first, site-packages when installed) is none of the script's
    skip = {os.path.abspath(script_dir) if script_dir else None, TRAINSPEED_ROOT}
    needed = []
    for entry in entries:
        root = os.path.abspath(entry)
        if root in skip:
            continue
        prefix = root.rstrip(os.sep) + os.sep
        if any(f.startswith(prefix) for f in files):
            needed.append(entry)
    return os.pathsep.join(needed) or None
