"""Generic machinery behind `trainspeed.config`: type checks, dict <-> dataclass, overrides.

Nothing here knows the concrete sections; it works on any `@dataclass` tree whose leaves are
annotated with simple types (bool, int, float, str, None, Literal, list[X], tuple[X, ...],
dict[str, Any], unions of these, or nested dataclasses). Recipes reuse `from_dict` to
validate their own options dataclasses under the `recipe.options.` prefix.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, Sequence

import yaml

from trainspeed.errors import ConfigError
from trainspeed.fileio import atomic_write_text

# YAML 1.1 (PyYAML) reads `1e-3` as a *string* because its float pattern needs a dot. A float
# field given such a string is converted instead of rejected: everyone writes `lr: 3e-4`.
_FLOAT_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")

_HINTS_CACHE: dict[type, dict[str, Any]] = {}


def type_hints(cls: type) -> dict[str, Any]:
    """Resolved field annotations of a dataclass (cached; `from __future__` makes them strings)."""
    hints = _HINTS_CACHE.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _HINTS_CACHE[cls] = hints
    return hints


# --------------------------------------------------------------------------- type checking


def describe_type(tp: Any) -> str:
    """Human-readable name of an annotation: `int or null`, `one of 'auto', true, false`."""
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any value"
    if origin is Literal:
        return "one of " + ", ".join(_show(v) for v in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_type(a) for a in typing.get_args(tp))
    if origin in (list, Sequence):
        (inner,) = typing.get_args(tp) or (Any,)
        return f"list of {describe_type(inner)}"
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {describe_type(args[0])}"
        return f"list of {len(args)} values ({', '.join(describe_type(a) for a in args)})"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _show(value: Any) -> str:
    """A value the way the user wrote it in YAML (true/false/null, quoted strings)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    return repr(value)


def _typename(value: Any) -> str:
    return "null" if value is None else type(value).__name__


_NO = object()  # "does not match" marker for coerce()
_YAML_BOOL_WORDS = {True: {"on", "yes", "y", "true"}, False: {"off", "no", "n", "false"}}


def coerce(value: Any, tp: Any) -> Any:
    """Return `value` converted to annotation `tp`, or `_NO` when it does not fit.

    Conversions are only the lossless, obvious ones: int -> float, numeric-looking str -> float,
    list -> tuple. bool is never accepted as int (YAML `true` is not a batch size).
    """
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if tp is type(None):
        return None if value is None else _NO
    if origin is Literal:
        for allowed in typing.get_args(tp):
            # `1 == True` in Python, so compare the types as well as the values.
            if value == allowed and type(value) is type(allowed):
                return allowed
        if isinstance(value, bool):
            # YAML 1.1 reads an unquoted `off`/`on`/`no`/`yes` as a bool, so `compile.mode=off`
            # arrives as False: take it back to the one allowed word it can have been.
            words = [a for a in typing.get_args(tp) if isinstance(a, str) and a.lower() in _YAML_BOOL_WORDS[value]]
            if len(words) == 1:
                return words[0]
        return _NO
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            out = coerce(value, arg)
            if out is not _NO:
                return out
        return _NO
    if tp is bool:
        return value if isinstance(value, bool) else _NO
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _NO
    if tp is float:
        if isinstance(value, bool):
            return _NO
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
            return float(value)
        return _NO
    if tp is str:
        return value if isinstance(value, str) else _NO
    if origin in (list, Sequence):
        if not isinstance(value, (list, tuple)):
            return _NO
        (inner,) = typing.get_args(tp) or (Any,)
        items = [coerce(v, inner) for v in value]
        return _NO if any(i is _NO for i in items) else items
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return _NO
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            items = [coerce(v, args[0]) for v in value]
        elif len(args) != len(value):
            return _NO
        else:
            items = [coerce(v, a) for v, a in zip(value, args)]
        return _NO if any(i is _NO for i in items) else tuple(items)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            return _NO
        return value
    if isinstance(tp, type):
        return value if isinstance(value, tp) else _NO
    return value  # an annotation we do not understand: accept rather than block the user


def check_fields(obj: Any, prefix: str) -> None:
    """Type-check (and lightly coerce) every field of dataclass instance `obj` in place.

    Called first thing in each section's `__post_init__`, so constructing a section in Python
    (`DataConfig(batch_size="16")`) fails exactly like loading it from YAML does.
    """
    hints = type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            if not isinstance(value, tp):
                raise ConfigError(
                    f"{prefix}{f.name} must be a {tp.__name__} (a mapping in YAML), "
                    f"got {value!r} ({_typename(value)})"
                )
            continue
        out = coerce(value, tp)
        if out is _NO:
            raise ConfigError(
                f"{prefix}{f.name} must be {describe_type(tp)}, got {_show(value)} ({_typename(value)})"
            )
        if out is not value:
            setattr(obj, f.name, out)


# --------------------------------------------------------------------------- dict -> dataclass


def known_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of a dataclass tree: ['run', 'run.name', ..., 'channels_last']."""
    keys: list[str] = []
    hints = type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            keys.append(f"{prefix}{f.name}")  # the section itself, for "did you mean 'data'?"
            keys.extend(known_keys(tp, f"{prefix}{f.name}."))
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def did_you_mean(key: str, candidates: Sequence[str]) -> str | None:
    """Closest known key to a misspelled one; prefers the same leaf name in another section."""
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf and c != key]
    if same_leaf:
        return same_leaf[0]
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if close:
        return close[0]
    by_leaf = {c.rsplit(".", 1)[-1]: c for c in candidates}
    close = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.7)
    return by_leaf[close[0]] if close else None


def unknown_key_error(key: str, candidates: Sequence[str], what: str = "setting") -> ConfigError:
    suggestion = did_you_mean(key, candidates)
    hint = f"; did you mean '{suggestion}'?" if suggestion else ""
    return ConfigError(f"unknown {what} '{key}'{hint}")


def from_dict(cls: type, data: Any, prefix: str = "", *, all_keys: Sequence[str] | None = None):
    """Build dataclass `cls` from a (YAML) mapping; unknown keys raise with a suggestion.

    `prefix` is the dotted path of this mapping ("data."), used in every message. `all_keys`
    are the candidates for "did you mean" (defaults to the keys below `cls`).
    """
    if all_keys is None:
        all_keys = known_keys(cls, prefix)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        where = prefix.rstrip(".") or "the config"
        raise ConfigError(f"{where} must be a mapping of settings, got {_show(data)} ({_typename(data)})")
    hints = type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str) or key not in fields:
            raise unknown_key_error(f"{prefix}{key}", all_keys)
        tp = hints[key]
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            kwargs[key] = from_dict(tp, value, f"{prefix}{key}.", all_keys=all_keys)
        else:
            kwargs[key] = value
    return cls(**kwargs)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass `cls` ({} when its source is not readable):
    what `trainspeed train TARGET --help` prints next to each key."""
    import ast
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, nxt in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def to_dict(obj: Any) -> Any:
    """Dataclass tree -> plain dicts/lists/scalars (tuples become lists, so YAML stays plain)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


# --------------------------------------------------------------------------- overrides


def parse_value(text: str) -> Any:
    """A CLI value parsed as a YAML scalar: `4`, `true`, `null`, `[a,b]`, `3e-4` (-> float)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text  # e.g. `a: b` typed on the CLI; keep the raw string and let typing judge
    if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
        # YAML 1.1 reads `1e-3` and `1.0e3` as strings; on the CLI nobody means that.
        try:
            return float(value)
        except ValueError:  # pragma: no cover - regex guarantees a float literal
            return value
    return value


def split_overrides(overrides: Sequence[str]) -> list[tuple[str, str]]:
    """Accept `a.b=1`, `--a.b=1` and `--a.b 1` (two tokens); return (key, raw value) pairs."""
    pairs: list[tuple[str, str]] = []
    tokens = list(overrides)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        dashed = tok.startswith("--")
        body = tok[2:] if dashed else tok
        if "=" in body:
            key, raw = body.split("=", 1)
            i += 1
        elif dashed and body:
            if i + 1 >= len(tokens):
                raise ConfigError(f"override '{tok}' has no value; write '{tok} VALUE' or '{body}=VALUE'")
            key, raw = body, tokens[i + 1]
            i += 2
        else:
            raise ConfigError(f"override '{tok}' must look like 'section.key=value' (e.g. data.num_workers=4)")
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override '{tok}' has an empty key; write e.g. data.num_workers=4")
        pairs.append((key, raw))
    return pairs


def apply_overrides(cfg_dict: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of nested `cfg_dict` with dotted overrides applied (input is not mutated).

    Keys are not checked here (`from_dict` checks them, with suggestions); this only refuses to
    descend into a value that is not a mapping (`data.batch_size.x=1`).
    """
    out = copy.deepcopy(cfg_dict) if cfg_dict else {}
    for key, raw in split_overrides(overrides):
        parts = key.split(".")
        node = out
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                parent = ".".join(parts[: depth + 1])
                raise ConfigError(
                    f"override '{key}': '{parent}' is a value ({_show(child)}), not a section"
                )
            node = child
        node[parts[-1]] = parse_value(raw)
    return out


# --------------------------------------------------------------------------- YAML files


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file '{path}' does not exist") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file '{path}' is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of sections, got {_typename(data)}")
    return data


def write_yaml_atomic(path: str | os.PathLike, data: dict[str, Any], *,
                      write: Callable[..., Path] | None = None) -> None:
    """Write YAML via temp file + rename, so a crash never leaves a half-written config (or
    through `write`: a FileSet's, where the file lands with others: trainspeed.fileset)."""
    (write or atomic_write_text)(path, yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


class Section:
    """Base of the config sections: shared validation helpers; `_key` is the section's name in
    YAML ("data"). Subclasses call `self._check()` and the range helpers in __post_init__."""

    __slots__ = ()
    _key: ClassVar[str] = ""

    def _check(self) -> None:
        check_fields(self, f"{self._key}." if self._key else "")

    def _fail(self, name: str, rule: str) -> None:
        value = getattr(self, name)
        shown = _show(value)
        raise ConfigError(f"{self._key}.{name} must be {rule}, got {shown}")

    def _min(self, name: str, low: float, *, optional: bool = False) -> None:
        value = getattr(self, name)
        if value is None and optional:
            return
        if value < low:
            self._fail(name, f">= {low}")

    def _positive(self, name: str, *, optional: bool = False) -> None:
        value = getattr(self, name)
        if value is None and optional:
            return
        if not value > 0:
            self._fail(name, "> 0")
