"""What `train` and `tune` share about a target (a YAML file, a recipe name, an import path):
loading it with its note and checks, `TARGET --help` (every key with its value and meaning),
`--print-config`, and the optional extras the config needs, named before any work starts."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
from typing import Any, Callable, Sequence

HELP_FLAGS = ("--help", "-h")


def parse_rest(args: argparse.Namespace, add_options: Callable[[argparse.ArgumentParser], None],
               prog: str) -> tuple[bool, list[str]]:
    """(`TARGET --help` asked, the overrides) of what follows the target: the subcommand's own
    options may come after it (`train gpt --naive run.max_steps=5`), parsed by argparse into
    `args` (an option given before the target keeps its value); what argparse does not know is
    an override (key=value or --key value). `--help` after the target asks for the target's keys."""
    rest = [a for a in args.rest if a not in HELP_FLAGS]
    parser = argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)  # --help is no --help-knobs
    add_options(parser)
    _, overrides = parser.parse_known_args(rest, namespace=args)
    return len(rest) < len(args.rest), overrides


def load(target: str, overrides: Sequence[str], variant: str, *, quiet: bool = False):
    """The validated TrainConfig of `target`, its recipe found and its options checked. A note
    on what the target was taken for (a recipe, though a folder has its name) goes to stderr."""
    from trainspeed.engine.from_recipe import check_recipe, load_found, resolve

    found = resolve(target, variant)
    if found.note and not quiet:
        print(f"trainspeed: {found.note}", file=sys.stderr)
    cfg, overlay = load_found(found, variant, overrides)
    if overlay and not quiet:
        print(f"trainspeed: on CUDA the fast variant adds {overlay} (bf16, compile, fused optimizer, "
              "pinned memory, a larger batch); override any key on the command line", file=sys.stderr)
    check_recipe(cfg)
    return cfg, found


def named(found, overrides: Sequence[str]) -> bool:
    """Whether the target or the command line set run.name (else it is derived at load time,
    '<recipe>-<timestamp>', and a printed config must not freeze it: every run would reuse it)."""
    from trainspeed.config_io import apply_overrides, read_yaml

    raw = found.source if isinstance(found.source, dict) else read_yaml(found.source)
    run = apply_overrides(raw, overrides).get("run")
    return isinstance(run, dict) and run.get("name") is not None


def config_yaml(cfg, *, keep_name: bool = True) -> str:
    """The resolved config as YAML that `trainspeed train` loads back to the same config."""
    import yaml

    from trainspeed.config import config_to_dict

    data = config_to_dict(cfg)
    if not keep_name:
        data["run"]["name"] = None
    data["recipe"]["options"] = _options_with_defaults(cfg, data["recipe"].get("options") or {})
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _options_with_defaults(cfg, given: dict) -> dict:
    """recipe.options as the recipe reads them, its defaults included: a YAML made from
    --print-config read `options: {}`, naming none of the options it could edit. The given ones
    alone where the recipe cannot read them (a required one missing: its error comes at train)."""
    from trainspeed.errors import ConfigError
    from trainspeed.recipes import get_recipe

    try:
        options_fn = getattr(get_recipe(cfg.recipe.name), "options", None)
        options = options_fn(cfg) if callable(options_fn) else None
    except ConfigError:
        return given
    if not dataclasses.is_dataclass(options):
        return given
    import json

    # each option as given, else its declared default, not the value the recipe resolved from it:
    # gpt's n_layer is null (from size), and a pinned 4 would outlive an edit of size
    full = {}
    for f in dataclasses.fields(options):
        value = given.get(f.name, f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
        if value is not dataclasses.MISSING:  # a required option not given: its error comes at train
            full[f.name] = value
    try:
        return json.loads(json.dumps(full))  # plain YAML types only (a tuple as a list)
    except (TypeError, ValueError):
        return given


# --------------------------------------------------------------------------- TARGET --help


def _show(value: Any) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text[:-4].strip() if text.endswith("\n...") else text


def _first_sentence(doc: str, limit: int = 160) -> str:
    import re

    m = re.search(r"\.\s+(?=[A-Z])", doc)  # not at "e.g. '50-55'"
    text = doc if m is None else doc[: m.start() + 1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _rows(obj: Any, prefix: str, skip: Sequence[str] = ()) -> list[tuple[str, str, str]]:
    """(key, value, doc) for every leaf field below dataclass instance `obj`."""
    from trainspeed.config_io import field_docs

    docs = field_docs(type(obj))
    rows: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(obj):
        key, value = f"{prefix}{f.name}", getattr(obj, f.name)
        if key in skip:
            continue
        if dataclasses.is_dataclass(value):
            rows.extend(_rows(value, f"{key}.", skip))
        else:
            choices = _choices(type(obj), f.name)  # precision.mode's "Numeric precision." named none
            rows.append((key, _show(value), _first_sentence(docs.get(f.name, ""))
                         + (f" One of: {', '.join(choices)}." if choices else "")))
    return rows


def _choices(cls: type, name: str) -> list[str]:
    """The values a Literal-typed field takes (None among them as null), else []."""
    import typing

    try:
        hint = typing.get_type_hints(cls).get(name)
    except Exception:  # noqa: BLE001 - a hint that does not resolve: no choices shown
        return []
    args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) is typing.Union else [hint]
    for a in args:
        if typing.get_origin(a) is typing.Literal:
            return [str(v) for v in typing.get_args(a)]
    return []


def target_help(command: str, target: str, overrides: Sequence[str], variant: str) -> str:
    """Every key of the target's config with its value there (command line applied) and what
    it does; then the recipe's own options with their values."""
    cfg, found = load(target, overrides, variant, quiet=True)
    from trainspeed.recipes.registry import get_recipe

    if not named(found, overrides):
        cfg.run.name = None  # type: ignore[assignment] - shown as null: derived when the run starts

    recipe = get_recipe(cfg.recipe.name)  # type: ignore[arg-type] - load() checked it
    options_fn = getattr(recipe, "options", None)
    options = options_fn(cfg) if callable(options_fn) else None
    rows = _rows(cfg, "", skip=("recipe.options",) if dataclasses.is_dataclass(options) else ())
    if dataclasses.is_dataclass(options):
        rows += _rows(options, "recipe.options.")
    width = min(40, max(len(k) for k, _, _ in rows))
    vwidth = min(24, max(len(v) for _, v, _ in rows))
    lines = [f"trainspeed {command} {target}: {found.describe}"]
    if found.note:
        lines.append(f"note: {found.note}")
    lines += ["Every setting with its value for this target; change one with key=value or --key value.", ""]
    section = None
    for key, value, doc in rows:
        head = key.split(".", 1)[0] if "." in key else ""
        if key.startswith("recipe.options."):
            head = f"recipe.options (checked by {cfg.recipe.name})"
        if head != section:
            section = head
            lines.append(f"{head or 'top level'}:")
        lines.append(f"  {key:<{width}} {value:<{vwidth}} {doc}".rstrip())
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- optional extras


_SINK_EXTRAS = {"tensorboard": ("tensorboard", "tensorboard", "tensorboard"), "wandb": ("wandb", "wandb", "wandb")}
"""sink -> (module to find, pip package, trainspeed extra)."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_extras(cfg) -> list[tuple[str, str, str]]:
    """(what needs it, pip package, extra) for each optional package the config needs but this
    environment lacks: the sinks, a checkpoint mirror, the recipe's own library."""
    from trainspeed.recipes.registry import recipe_extras

    needs: list[tuple[str, str, str, str]] = []
    for sink in cfg.logging.sinks:
        if sink in _SINK_EXTRAS:
            module, package, extra = _SINK_EXTRAS[sink]
            needs.append((f"logging.sinks '{sink}'", module, package, extra))
    if cfg.checkpoint.mirror:
        needs.append((f"checkpoint.mirror={cfg.checkpoint.mirror!r}", "fsspec", "fsspec", "all"))
    for module, package, extra in recipe_extras(cfg.recipe.name or ""):
        needs.append((f"recipe.name={cfg.recipe.name!r}", module, package, extra))
    return [(what, package, extra) for what, module, package, extra in needs if not _installed(module)]


def check_extras(cfg) -> None:
    """MissingDependencyError naming every missing package and one pip command for all."""
    from trainspeed.errors import MissingDependencyError

    missing = missing_extras(cfg)
    if not missing:
        return
    what, package, extra = missing[0]
    if len(missing) > 1:
        extras = ",".join(dict.fromkeys(e for _, _, e in missing))
        listed = "; ".join(f"{w} needs '{p}'" for w, p, _ in missing)
        text = f"{listed}: not installed. Install them with: pip install 'trainspeed[{extras}]'"
    else:
        text = (f"{what} needs the '{package}' package, which is not installed. Install it with: "
                f"pip install 'trainspeed[{extra}]'")
    lacking = {w.split("'")[1] for w, _, _ in missing if w.startswith("logging.sinks")}
    if lacking:
        keep = [s for s in cfg.logging.sinks if s not in lacking] or ["jsonl"]
        text += f" (or leave {'it' if len(lacking) == 1 else 'them'} out: logging.sinks=[{','.join(keep)}])"
    error = MissingDependencyError(package, extra, what)
    error.msg = text  # ImportError's str() is its msg
    error.args = (text,)
    raise error
