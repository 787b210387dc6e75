"""Built-in workloads (gpt, convnext, seqvae, ...): `get_recipe(name).build(config)`."""

from __future__ import annotations

from trainspeed.recipes.base import BatchStats, Recipe, RecipeParts, parse_options
from trainspeed.recipes.registry import get_recipe, list_recipes, recipe_names, register_recipe

__all__ = [
    "BatchStats", "Recipe", "RecipeParts", "parse_options",
    "get_recipe", "list_recipes", "recipe_names", "register_recipe",
]
