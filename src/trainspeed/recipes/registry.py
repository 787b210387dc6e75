"""Name -> recipe, loaded lazily so listing recipes never imports torch-heavy modules twice.

A recipe package `trainspeed.recipes.<name>` exposes its Recipe object as `RECIPE`; the
entries below point at that. Adding a recipe is one line here (or `register_recipe` at
runtime for plugins).
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
    """The recipe called `name`; unknown names raise ConfigError with a suggestion and the list."""
    if name in _LOADED:
        return _LOADED[name]
    names = recipe_names()
    if name not in _RECIPES or name not in names:
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(f"unknown recipe '{name}'; {hint}available recipes: {', '.join(names) or 'none'}")
    module_name, attr = _RECIPES[name].split(":", 1)
    obj = getattr(importlib.import_module(module_name), attr)
    recipe = obj() if isinstance(obj, type) else obj
    _LOADED[name] = recipe
    return recipe


def list_recipes() -> list[Recipe]:
    """Every available recipe, sorted by name."""
    return [get_recipe(n) for n in recipe_names()]
