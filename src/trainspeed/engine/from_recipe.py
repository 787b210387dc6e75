"""Build a Trainer from a config that names a recipe (used by `trainspeed train` and the tuner).

A command-line target is a YAML file, a built-in recipe name (`gpt`: its naive/fast config) or
your own recipe's import path (`mymodel:build`: its defaults). `resolve` says which one a
target is, and why, in `Target.note` when a same-named folder or file could have been meant.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from trainspeed import config_io
from trainspeed.config import TrainConfig, load_config
from trainspeed.device_spec import cuda_index
from trainspeed.engine.events import Callback
from trainspeed.engine.trainer import Trainer
from trainspeed.errors import ConfigError

OWN_MODEL_DOC = "docs/own-model.md"


@dataclass(frozen=True)
class Target:
    """What a command-line target resolved to."""

    source: Path | dict[str, Any]
    """The YAML file to load, or the config as a dict (an import path without config files)."""
    kind: str
    """'file', 'recipe' (built-in name) or 'import' (your recipe's import path)."""
    describe: str
    """For people: "recipe gpt (fast config: .../fast.yaml)", "config my.yaml"."""
    note: str | None = None
    """Set when the target could have meant something else (a folder named like a recipe)."""


def resolve(target: str, variant: str = "fast") -> Target:
    """A file wins; then a recipe name or import path; a folder of that name is never a config."""
    from trainspeed.recipes.registry import get_recipe, recipe_names

    path = Path(target)
    if path.is_file():
        return Target(path, "file", f"config {target}")
    if ":" in target:  # mymodel:build (a Windows drive path 'C:\\x.yaml' was a file above)
        recipe = get_recipe(target)
        own = getattr(recipe, "has_config_path", lambda: True)()
        if own:
            return Target(Path(recipe.config_path(variant)), "import", f"recipe {target} ({variant} config)")
        if variant != "fast":
            recipe.config_path(variant)  # ConfigError: it ships no such config; write a YAML
        return Target({"recipe": {"name": target}}, "import", f"recipe {target} (defaults)")
    names = recipe_names()
    if path.suffix in (".yaml", ".yml"):
        near = sorted(p.name for p in (path.parent if str(path.parent) else Path(".")).glob("*.y*ml"))
        guess = config_io.did_you_mean(path.name, near) if near else None
        hint = f" Did you mean '{path.with_name(guess)}'?" if guess else ""
        raise ConfigError(f"config file '{target}' does not exist.{hint} Give a YAML file or a recipe "
                          f"name ({', '.join(names)})")
    if target in names:
        recipe = get_recipe(target)
        config = Path(recipe.config_path(variant))
        note = None
        if path.exists():
            note = (f"'{target}' is the built-in recipe {target} ({variant} config: {config}); "
                    f"./{target} is a folder, not a config file")
        elif Path(f"{target}.yaml").is_file() or Path(f"{target}.yml").is_file():
            file = f"{target}.yaml" if Path(f"{target}.yaml").is_file() else f"{target}.yml"
            note = f"'{target}' is the built-in recipe {target}; to train ./{file}, give that name"
        return Target(config, "recipe", f"recipe {target} ({variant} config: {config})", note)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.y*ml"))[:5]
        hint = f" (it holds {', '.join(inside)})" if inside else ""
        raise ConfigError(f"'{target}' is a folder{hint}, not a config file, and no recipe has that name. "
                          f"Give a YAML file, a recipe name ({', '.join(names)}) or your model's import "
                          f"path (mymodel:build, see {OWN_MODEL_DOC})")
    get_recipe(target)  # unknown: ConfigError with "did you mean" and the list
    raise ConfigError(f"unknown target '{target}'")  # pragma: no cover - get_recipe raised


def resolve_target(target: str, variant: str = "fast") -> Path:
    """`gpt` -> the recipe's <variant>.yaml; a path -> itself (must exist)."""
    found = resolve(target, variant)
    if isinstance(found.source, dict):
        raise ConfigError(f"{found.describe} has no config file; load it with load_target")
    return found.source


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_found(found: Target, variant: str, overrides: Sequence[str]) -> tuple[TrainConfig, str | None]:
    """The config of a resolved target, and the device overlay laid over it (or None). "fast"
    means fast on the device it runs on: a built-in recipe's fast variant on CUDA (run.device
    auto with a GPU, or cuda, after the overrides) takes the recipe's fast-cuda.yaml over
    fast.yaml (bf16, compile, fused AdamW, pinned memory, a larger batch);
    the command line's overrides still win. On a CPU nothing changes."""
    cfg = load_config(found.source, overrides)
    if found.kind != "recipe" or variant != "fast" or not isinstance(found.source, Path):
        return cfg, None
    overlay = found.source.with_name("fast-cuda.yaml")
    if not overlay.is_file() or cuda_index(cfg.run.device) is None:
        return cfg, None
    data = _merge(config_io.read_yaml(found.source), config_io.read_yaml(overlay))
    return load_config(data, overrides), str(overlay)


def check_recipe(cfg: TrainConfig) -> None:
    """Fail before any work when the config's recipe cannot be found or its options are wrong:
    a command-line config must name a recipe; an import path must import."""
    from trainspeed.recipes.registry import get_recipe

    if not cfg.recipe.name:
        raise ConfigError("recipe.name is not set: a config run from the command line names a built-in "
                          "recipe (recipe: {name: gpt}) or your own model as an import path "
                          f"(recipe: {{name: mymodel:build}}, see {OWN_MODEL_DOC}); in Python, "
                          "trainspeed.Trainer(model, loss_fn, data, config=...) needs no recipe")
    recipe = get_recipe(cfg.recipe.name)
    options = getattr(recipe, "options", None)
    if callable(options):
        options(cfg)  # validates recipe.options (unknown keys: "did you mean")


def build_trainer(cfg: TrainConfig, callbacks: Sequence[Callback] = ()) -> Trainer:
    from trainspeed.recipes.registry import get_recipe

    check_recipe(cfg)
    parts = get_recipe(cfg.recipe.name).build(cfg)  # type: ignore[arg-type] - checked above
    return Trainer(
        parts.model, parts.loss_fn, parts.train_data, parts.val_data, config=cfg,
        callbacks=callbacks, collate_fn=parts.collate_fn, batch_stats=parts.batch_stats,
        lengths=parts.lengths, eval_metrics=parts.eval_metrics,
        flops_per_token=parts.flops_per_token,
    )


def load_target(target: str, overrides: Sequence[str] = (), variant: str = "fast") -> TrainConfig:
    return load_config(resolve(target, variant).source, overrides)
