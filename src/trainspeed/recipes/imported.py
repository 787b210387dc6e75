"""Your own model as a recipe: `recipe.name` holds an import path `module:attr`.

    recipe:
      name: mymodel:build        # mymodel.py next to where you run trainspeed
      options: {width: 128}      # keyword arguments of build()

The object at the path is either
- a function returning `RecipeParts`: a parameter called `config` receives the TrainConfig,
  every other parameter is an option (`recipe.options.<param>`, validated against its
  annotation and default, unknown ones get a "did you mean"); or
- a Recipe: an object with `build(config) -> RecipeParts`, or a class making one with no
  arguments (its own `options(config)` validates `recipe.options`, as the built-ins do).

Modules resolve as under `python -m`: the current directory comes first on sys.path. That is
also what the tuner's trials see (they run in the tuner's directory), so a config that trains
here tunes here. Every failure is a ConfigError that names `recipe.name`, the path, and which
step failed: the module is not found, it failed to import, the attribute is missing, or the
factory raised (with the file:line where it did).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
import traceback
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from trainspeed.errors import ConfigError, TrainspeedError

if TYPE_CHECKING:
    from trainspeed.config import TrainConfig
    from trainspeed.recipes.base import RecipeParts

KEY = "recipe.name"
DOC = "docs/own-model.md"


def is_import_path(name: str) -> bool:
    """`pkg.mod:attr` (the form of console-script entry points), not a registered recipe name."""
    return ":" in name


def check_import_path(name: str) -> None:
    from trainspeed.config import IMPORT_PATH

    if not IMPORT_PATH.fullmatch(name):
        raise ConfigError(f"{KEY}={name!r} is not an import path; write 'module:attr' with a dotted "
                          "module and an attribute, e.g. 'mypkg.models:build' (see " + DOC + ")")


# --------------------------------------------------------------------------- import


def _ensure_cwd_on_path() -> None:
    """What `python -m` does: the current directory first. The `trainspeed` console script
    starts with its bin directory there instead, so `mymodel:build` would not be found."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _where(exc: BaseException, near: str | None = None) -> str:
    """' (at file:line in fn)' of the deepest frame of exc's traceback, preferring frames in
    files under `near` (the user's package), so the message points at the user's line."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" (at {exc.filename}:{exc.lineno})"
    if near:
        mine = [f for f in frames if f.filename.startswith(near)]
        frames = mine or frames
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename}:{f.lineno} in {f.name})"


def import_object(path: str, key: str = KEY) -> Any:
    """The object at `module:attr`, or a ConfigError saying which part failed and why."""
    check_import_path(path)
    module_name, attr = path.split(":", 1)
    if module_name.endswith(".py"):  # a file's name where the module's goes: `mymodel.py:build`
        module = module_name[:-3].replace("/", ".").strip(".")
        raise ConfigError(f"{key}={path!r}: write the module, not its file: did you mean '{module}:{attr}'? "
                          "(run trainspeed from the folder that holds it)")
    _ensure_cwd_on_path()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ConfigError(
                f"{key}={path!r}: module '{module_name}' not found (no module named '{missing}' in the "
                f"current directory {os.getcwd()} or the installed packages). Run trainspeed from the "
                f"folder that holds it, `pip install -e` your package, or add its folder to PYTHONPATH"
            ) from exc
        raise ConfigError(f"{key}={path!r}: module '{module_name}' was found but failed to import: it "
                          f"imports '{missing}', which is not installed{_where(exc)}") from exc
    except TrainspeedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module raised at import: say where
        raise ConfigError(f"{key}={path!r}: importing module '{module_name}' raised "
                          f"{type(exc).__name__}: {exc}{_where(exc)}") from exc
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = module_name if i == 0 else f"{module_name}:{'.'.join(attr.split('.')[:i])}"
            names = [n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None))
                     and getattr(getattr(obj, n), "__module__", module_name) == module_name]
            if i > 0 and not names:  # `mymodel:build.x`: build is a function, it has no attributes
                raise ConfigError(f"{key}={path!r}: '{'.'.join(attr.split('.')[:i])}' in module '{module_name}' is a "
                                  f"{type(obj).__name__}, which has no '{part}'; the target is 'module:function' "
                                  f"(e.g. '{module_name}:{attr.split('.')[0]}')")
            from trainspeed.config_io import did_you_mean

            guess = did_you_mean(part, names)
            hint = f"did you mean '{guess}'? " if guess else ""
            where = getattr(module, "__file__", None) or module_name
            raise ConfigError(f"{key}={path!r}: module '{owner}' ({where}) has no attribute '{part}'; "
                              f"{hint}it defines: {', '.join(sorted(names)[:12]) or 'nothing callable'}")
        obj = getattr(obj, part)
    return obj


# --------------------------------------------------------------------------- the recipe


class ImportedRecipe:
    """A recipe from an import path: a RecipeParts factory function, or the user's Recipe."""

    def __init__(self, path: str, obj: Any, module_dir: str | None) -> None:
        self.name = path
        self._dir = module_dir
        if inspect.isclass(obj):
            try:
                obj = obj()
            except Exception as exc:  # noqa: BLE001
                raise ConfigError(f"{KEY}={path!r}: a Recipe class is made with no arguments, but "
                                  f"{obj.__name__}() raised {type(exc).__name__}: {exc}") from exc
        self._recipe = obj if callable(getattr(obj, "build", None)) else None
        if self._recipe is None and not callable(obj):
            raise ConfigError(f"{KEY}={path!r} is a {type(obj).__name__}, not a function returning "
                              "RecipeParts nor a Recipe (an object with build(config))")
        self._fn: Callable[..., Any] | None = None if self._recipe is not None else obj
        self._options_cls = None if self._fn is None else options_class(path, self._fn)
        doc = getattr(self._recipe, "description", None) or inspect.getdoc(self._recipe or obj) or ""
        self.description = str(doc).strip().splitlines()[0] if doc else f"your model ({path})"

    def options(self, config: TrainConfig) -> Any:
        """The validated `recipe.options`: a dataclass of the function's parameters, or what the
        user's Recipe.options returns (None when it has no options method)."""
        if self._recipe is not None:
            own = getattr(self._recipe, "options", None)
            if callable(own):
                return own(config)
            if config.recipe.options:
                keys = ", ".join(f"recipe.options.{k}" for k in config.recipe.options)
                raise ConfigError(f"{keys}: the recipe {self.name!r} has no options() method to read "
                                  "them; remove them or give the recipe an options(config) method")
            return None
        from trainspeed.recipes.base import parse_options

        given = config.recipe.options or {}
        missing = [n for n in self._options_cls._required if n not in given]  # type: ignore[union-attr]
        if missing:
            keys = ", ".join(f"recipe.options.{n}" for n in missing)
            raise ConfigError(f"{keys}: required by {self.name} (the parameter has no default); set it "
                              f"under recipe: options: in the YAML, or on the command line as {keys.split(', ')[0]}=VALUE")
        return parse_options(self._options_cls, given)

    def build(self, config: TrainConfig) -> RecipeParts:
        from trainspeed.recipes.base import RecipeParts

        if self._recipe is not None:
            self.options(config)  # options given to a recipe that cannot read them are refused
            call, what = (lambda: self._recipe.build(config)), f"{type(self._recipe).__name__}.build(config)"
        else:
            opts = self.options(config)
            kwargs = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
            if _takes_config(self._fn):
                kwargs["config"] = config
            call, what = (lambda: self._fn(**kwargs)), f"{self.name.split(':', 1)[1]}(...)"
        try:
            parts = call()
        except (TrainspeedError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - the user's factory raised: say where
            raise ConfigError(f"{KEY}={self.name!r}: {what} raised {type(exc).__name__}: {exc}"
                              f"{_where(exc, self._dir)}") from exc
        if not isinstance(parts, RecipeParts):
            raise ConfigError(f"{KEY}={self.name!r}: {what} returned {type(parts).__name__}; it must return "
                              "trainspeed.recipes.RecipeParts(model=..., loss_fn=..., train_data=...)")
        return parts

    def config_path(self, variant: str) -> Path:
        own = getattr(self._recipe, "config_path", None)
        if callable(own):
            return Path(own(variant))
        raise ConfigError(f"recipe {self.name!r} ships no '{variant}' config; write a YAML with "
                          f"recipe: {{name: {self.name}}} and train that (see {DOC})")

    def has_config_path(self) -> bool:
        return callable(getattr(self._recipe, "config_path", None))


def _takes_config(fn: Callable[..., Any]) -> bool:
    return "config" in inspect.signature(fn).parameters


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Resolved annotations of fn's parameters; one that does not resolve (a name imported only
    under TYPE_CHECKING) is left out, so its option is not type-checked rather than refused."""
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - resolve them one by one below
        pass
    out: dict[str, Any] = {}
    for name, ann in getattr(fn, "__annotations__", {}).items():
        try:
            out[name] = eval(ann, getattr(fn, "__globals__", {})) if isinstance(ann, str) else ann  # noqa: S307
        except Exception:  # noqa: BLE001
            continue
    return out


CONFIG_LIKE = ("cfg", "conf", "configuration", "train_config", "train_cfg", "trainconfig", "c")
"""First-parameter names meant as the TrainConfig, which build functions receive as `config`."""


def options_class(path: str, fn: Callable[..., Any]) -> type:
    """A config section made from fn's parameters (all but `config`): each becomes a field with
    its annotation and default, so `recipe.options` is checked like every other section."""
    from trainspeed.config_io import check_fields

    hints = _hints(fn)
    fields = []
    params = list(inspect.signature(fn).parameters.values())
    first = params[0] if params else None
    if (first is not None and first.name in CONFIG_LIKE and first.default is first.empty
            and not any(p.name == "config" for p in params)):
        # `def build(cfg, hidden=8)` read as a required option: "recipe.options.cfg: required by ..."
        raise ConfigError(f"{KEY}={path!r}: {fn.__name__}({first.name}, ...): the parameter that receives the "
                          f"TrainConfig must be called config; rename {first.name} to config (the other "
                          "parameters are recipe.options)")
    for p in params:
        if p.name == "config":
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise ConfigError(f"{KEY}={path!r}: {fn.__name__}() has *args, **kwargs or positional-only "
                              f"parameter '{p.name}'; name each option as a parameter, so recipe.options "
                              "can be checked (a parameter called config receives the TrainConfig)")
        tp = hints.get(p.name, Any)
        default = dataclasses.MISSING if p.default is p.empty else p.default
        if isinstance(default, (list, dict, set)):
            fields.append((p.name, tp, dataclasses.field(default_factory=lambda d=default: type(d)(d))))
        else:
            fields.append((p.name, tp, dataclasses.field(default=default)))

    def __post_init__(self) -> None:
        check_fields(self, "recipe.options.")

    cls = dataclasses.make_dataclass(f"{fn.__name__}_options", fields, kw_only=True,
                                     namespace={"__post_init__": __post_init__})
    cls.__doc__ = f"recipe.options of {path}"
    required = [name for name, _, f in fields if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]  # type: ignore[misc]
    cls._required = tuple(required)  # type: ignore[attr-defined]
    return cls


def load_recipe(path: str) -> ImportedRecipe:
    obj = import_object(path)
    module = sys.modules.get(path.split(":", 1)[0])
    file = getattr(module, "__file__", None)
    top = sys.modules.get(path.split(":", 1)[0].split(".", 1)[0])
    root = getattr(top, "__file__", None) or file
    module_dir = str(Path(root).parent) if root else None
    return ImportedRecipe(path, obj, module_dir)
