"""Which installed libraries' modules the script imported (observation "imports").

The tune forks every trial of a script from a server that imported torch once
(tune/forkserver.py); what the script imports on top (transformers and its model code,
DeepSpeed, which imports torch's inductor for its Muon kernels inside `deepspeed.initialize`)
each trial imported again, 1-3 s of a trial of a few seconds on a 2-core machine. The doctor's
run (the tune's baseline trial is one) records those modules, and the tune's server imports
them once from then on (ScriptRunner.preload_more).

Only installed libraries' modules (patches/installed.py's rule): the script's own modules may
be edited by a code change (best.patch), and a trial must load its edited text, not a copy
the server took before the edit. trainspeed's own modules are left out (the server has them).
"""

from __future__ import annotations

import sys
from typing import Iterable

from trainspeed.patches.installed import is_installed

__all__ = ["MAX_MODULES", "library_imports"]

MAX_MODULES = 4000
"""At most this many names are recorded (transformers with one model family is ~1,500)."""

_OWN = "trainspeed"


def library_imports(before: Iterable[str]) -> list[str]:
    """Names of the modules imported since `before` (a snapshot of sys.modules' keys) whose
    files belong to an installed library, in the order they were first imported."""
    seen = set(before)
    names = []
    for name, module in list(sys.modules.items()):
        if name in seen or name.partition(".")[0] == _OWN or name in ("__main__", "__mp_main__"):
            continue
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not is_installed(path):
            continue
        names.append(name)
        if len(names) >= MAX_MODULES:
            break
    return names
