"""Whether `python -m NAME` would find NAME from the cwd, before the doctor makes a run
directory: a mistyped module (`-m nosuchmod`) read as the script's crash, with trainspeed's own
frames in the traceback and "pip install nosuchmod" as the fix."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def module_missing(name: str, cwd: str | None = None) -> bool:
    """True only where NAME is surely not there: its top-level package is found by no finder with
    the cwd first on sys.path (as `python -m` puts it), or one of its submodules is in none of its
    package's folders. The packages are looked up, never imported (an __init__ of the user's could
    import torch before the doctor's instrumentation); anything unsure counts as found, and the
    run's own import then says what is wrong."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return False  # runpy's own error says what is wrong with the name
    saved = sys.path[:]
    sys.path.insert(0, cwd or os.getcwd())
    try:
        spec = sys.modules[parts[0]].__spec__ if parts[0] in sys.modules else importlib.util.find_spec(parts[0])
        for i in range(1, len(parts)):
            if spec is None:
                return True
            where = spec.submodule_search_locations
            if where is None:
                return True  # a module, not a package: python -m a.b fails alike
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]), list(where))
        return spec is None
    except (ImportError, ValueError, AttributeError):
        return False
    finally:
        sys.path[:] = saved
