"""`runtime.cache_checks`: functools.cache around a library's package checks that it asks again
at every step (doctor/instrument/lookups.py finds them; accelerate's `is_lomo_available`, asked
twice a micro-batch in `AcceleratedOptimizer.step`). Whether a package is installed does not
change during a run, so the cached answer is the same one. Installed as each named module is
imported; undone at uninstall. `cache_code` is the same change as lines of the script, for the
doctor's advice and best.patch. Pure: no torch import (the doctor's checks use `cache_code`).
"""

from __future__ import annotations

import functools
import re
from typing import Any

NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
"""`module.function`: a dotted name with at least one dot."""


def valid_names(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(v, str) and NAME.match(v) for v in value))


def cache_code(names: list[str]) -> str:
    """`import functools, accelerate.optimizer` and one `m.f = functools.cache(m.f)` per name,
    as lines (each module imported once, each name once)."""
    names = list(dict.fromkeys(names))
    modules = sorted({name.rpartition(".")[0] for name in names})
    return "\n".join([f"import functools, {', '.join(modules)}",
                      *(f"{name} = functools.cache({name})" for name in names)])


def install_cache_checks(value: list[str], ctx: Any) -> None:
    """Cache each `module.function` once its module is imported (now, if it is already)."""
    for name in dict.fromkeys(value):
        module_name, _, attr = name.rpartition(".")
        ctx.imports.add(module_name, lambda module, attr=attr, name=name: _cache(module, attr, name, ctx))


def _cache(module: Any, attr: str, name: str, ctx: Any) -> None:
    function = getattr(module, attr, None)
    if not callable(function):
        ctx.note(f"cache_checks: {name} is not a function of {module.__name__} here: nothing cached")
        return
    ctx.patches.setattr(module, attr, _cached(function))
    ctx.note(f"cache_checks: {name} = functools.cache({name})")


def _cached(function: Any) -> Any:
    """functools.cache of `function`; a call with arguments that cannot be hashed (not a package
    check's: a best.yaml naming another function) is passed through uncached, not refused."""
    cached = functools.cache(function)

    @functools.wraps(function)
    def check(*args: Any, **kwargs: Any) -> Any:
        try:
            hash((args, tuple(kwargs.items())))
        except TypeError:
            return function(*args, **kwargs)
        return cached(*args, **kwargs)

    return check


__all__ = ["cache_code", "install_cache_checks", "valid_names"]
