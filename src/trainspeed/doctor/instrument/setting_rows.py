"""The rows of a "script_flags" observation, and the pure helpers that build them.

Every way a script takes its settings (argparse, `--key=value` read from sys.argv, nanoGPT's
configurator, minGPT's config tree, a Hydra config, LightningCLI) ends as the same rows: option,
dest, value, default, type, kind. Import-free, so each reader (flags.py, configurator.py,
config_objects.py, hydra_flags.py) builds them here without importing the others.
"""

from __future__ import annotations

import ast
from typing import Any

_PLAIN = (bool, int, float, str, type(None))
_SIMPLE = (bool, int, float, str)


def plain_value(value: Any) -> Any:
    """A JSON-able stand-in for a parsed value (paths and enums become their text)."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value):
        return list(value)
    return str(value)


def flags_from_argv(args: list[str]) -> list[dict[str, Any]]:
    """nanoGPT's configurator style: `--key=value` arguments read without argparse."""
    rows: list[dict[str, Any]] = []
    for arg in args:
        if not arg.startswith("--") or "=" not in arg:
            continue
        key, raw = arg[2:].split("=", 1)
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        rows.append({"option": f"--{key}", "options": [f"--{key}"], "dest": key, "value": plain_value(value),
                     "default": None, "type": type(value).__name__, "kind": "equals", "choices": None})
    return rows


def flatten_settings(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"trainer": {"num_workers": 4}}` -> `{"trainer.num_workers": 4}`: the simple values of a
    nested config, by dotted key. Interpolations (`${...}`) and missing values (`???`) are not
    settings to echo back."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if not isinstance(key, str):
            continue
        if isinstance(value, dict):
            out.update(flatten_settings(value, f"{prefix}{key}."))
        elif isinstance(value, _SIMPLE) and not (isinstance(value, str) and ("${" in value or value == "???")):
            out[f"{prefix}{key}"] = value
    return out


def setting_rows(values: dict[str, Any], dashes: str = "--",
                 defaults: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Rows of named settings, typed as `{dashes}key=value` (Hydra: no dashes). With `defaults`
    (the script's own values), each row's default and type are the default's."""
    return [{"option": f"{dashes}{key}", "options": [f"{dashes}{key}"], "dest": key, "value": value,
             "default": defaults[key] if defaults is not None else None,
             "type": type(defaults[key] if defaults is not None else value).__name__, "kind": "equals",
             "choices": None}
            for key, value in values.items()]


__all__ = ["flags_from_argv", "flatten_settings", "plain_value", "setting_rows"]
