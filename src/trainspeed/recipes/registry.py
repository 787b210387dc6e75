"""Name -> recipe, loaded lazily so listing recipes never imports torch-heavy modules twice.

A recipe package `trainspeed.recipes.<name>` exposes its Recipe object as `RECIPE`; the
entries below point at that. Adding a recipe is one line here (or `register_recipe` at
runtime for plugins). A name with a colon is an import path of the user's own recipe
(`mymodel:build`, see recipes/imported.py): imported on first use, never listed.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util

from trainspeed.errors import ConfigError
from trainspeed.recipes.base import Recipe

_RECIPES: dict[str, str] = {
    "gpt": "trainspeed.recipes.gpt:RECIPE",
    "convnext": "trainspeed.recipes.convnext:RECIPE",
    "seqvae": "trainspeed.recipes.seqvae:RECIPE",
    "hf": "trainspeed.recipes.hf:RECIPE",
}
_LOADED: dict[str, Recipe] = {}
_EXTRAS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "hf": (("transformers", "transformers", "hf"),),
    "convnext": (("PIL", "pillow", "vision"),),
}
"""Recipe -> (module, pip package, trainspeed extra) it imports when built: checked by the CLI
before a run starts, so a missing one is named up front with its pip command."""


def recipe_extras(name: str) -> tuple[tuple[str, str, str], ...]:
    """The optional packages recipe `name` needs: (module to import, pip package, extra)."""
    return _EXTRAS.get(name, ())


def register_recipe(name: str, target: str | Recipe) -> None:
    """Register a recipe by "module:attr" (loaded on first use) or as an object."""
    if isinstance(target, str):
        if ":" not in target:
            raise ConfigError(f"recipe target '{target}' must look like 'package.module:ATTR'")
        _RECIPES[name] = target
        _LOADED.pop(name, None)
    else:
        _RECIPES[name] = f"<object {type(target).__name__}>"
        _LOADED[name] = target


def _available(name: str) -> bool:
    target = _RECIPES[name]
    if name in _LOADED:
        return True
    module = target.split(":", 1)[0]
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing
        return False


def recipe_names() -> list[str]:
    """Registered recipes whose module is present (cheap: nothing is imported)."""
    return sorted(n for n in _RECIPES if _available(n))


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`, or at import path `module:attr`; unknown names raise
    ConfigError with a suggestion and the list."""
    from trainspeed.recipes import imported

    if name in _LOADED:
        return _LOADED[name]
    if imported.is_import_path(name) and name not in _RECIPES:
        # Not cached here: sys.modules caches the module, and the wrapper is cheap.
        return imported.load_recipe(name)  # type: ignore[return-value]
    names = recipe_names()
    if name not in _RECIPES or name not in names:
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        hint = f"did you mean '{close[0]}'? " if close else ""
        own = (f"; your own model is an import path 'module:attr' (did you mean "
               f"'{name.rsplit('.', 1)[0]}:{name.rsplit('.', 1)[1]}'?)" if "." in name.strip(".")
               else f"; for your own model give an import path, e.g. mymodel:build ({imported.DOC})")
        raise ConfigError(f"unknown recipe '{name}'; {hint}available recipes: {', '.join(names) or 'none'}{own}")
    module_name, attr = _RECIPES[name].split(":", 1)
    obj = getattr(importlib.import_module(module_name), attr)
    recipe = obj() if isinstance(obj, type) else obj
    _LOADED[name] = recipe
    return recipe


def list_recipes() -> list[Recipe]:
    """Every available recipe, sorted by name."""
    return [get_recipe(n) for n in recipe_names()]
