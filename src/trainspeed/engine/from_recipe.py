"""Build a Trainer from a config that names a recipe (used by `trainspeed train` and the tuner)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from trainspeed.config import TrainConfig, load_config
from trainspeed.engine.events import Callback
from trainspeed.engine.trainer import Trainer
from trainspeed.errors import ConfigError


def resolve_target(target: str, variant: str = "fast") -> Path:
    """`gpt` -> the recipe's <variant>.yaml; a path -> itself (must exist)."""
    from trainspeed.recipes.registry import get_recipe, recipe_names

    path = Path(target)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"config file {target!r} does not exist. Give a YAML file or a "
                              f"recipe name ({', '.join(recipe_names())}).")
        return path
    return Path(get_recipe(target).config_path(variant))


def build_trainer(cfg: TrainConfig, callbacks: Sequence[Callback] = ()) -> Trainer:
    from trainspeed.recipes.registry import get_recipe

    if not cfg.recipe.name:
        raise ConfigError("recipe.name is not set: a config run from the command line must name "
                          "a recipe (e.g. recipe: {name: gpt}); to train your own model, use "
                          "trainspeed.Trainer(model, loss_fn, data, config=...) in Python.")
    parts = get_recipe(cfg.recipe.name).build(cfg)
    return Trainer(
        parts.model, parts.loss_fn, parts.train_data, parts.val_data, config=cfg,
        callbacks=callbacks, collate_fn=parts.collate_fn, batch_stats=parts.batch_stats,
        lengths=parts.lengths, eval_metrics=parts.eval_metrics,
        flops_per_token=parts.flops_per_token,
    )


def load_target(target: str, overrides: Sequence[str] = (), variant: str = "fast") -> TrainConfig:
    return load_config(resolve_target(target, variant), overrides)
