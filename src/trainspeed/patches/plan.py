"""A settings file for an unchanged script: what `trainspeed tune -- CMD` writes as best.yaml
and `trainspeed run --with FILE -- CMD` applies.

    schema: 1
    kind: script-settings
    command: [python, train.py, --lr, '3e-4']     # the command that was tuned
    settings:                                      # patch keys (trainspeed.patches.SETTINGS)
      loader.num_workers: 2                        # and script flags (args.<option>)
      args.--compile: true
    flag_styles: {--compile: bare}                 # how each flag is written on a command line
    targets: {loader_site: [/abs/train.py, 21], ...}   # where the patches apply (the doctor saw it)

Flags are the script's own: a setting its argparse exposes is passed as that flag (the result
is stated as the flag to pass), everything else is a patch installed before its first line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainspeed.errors import ConfigError
from trainspeed.patches.targets import Targets

KIND = "script-settings"
FLAG_PREFIX = "args."


@dataclass(kw_only=True)
class Plan:
    command: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    targets: Targets = field(default_factory=Targets)
    flag_styles: dict[str, str] = field(default_factory=dict)
    """option -> "space" (`--workers 4`), "equals" (`--compile=True`), "bare" (`--compile`) or
    "negated" (`--no_pin_memory`: given, its setting is False)."""

    def patch_settings(self) -> dict[str, Any]:
        return {k: v for k, v in self.settings.items() if not k.startswith(FLAG_PREFIX)}

    def flags(self) -> dict[str, Any]:
        return {k[len(FLAG_PREFIX):]: v for k, v in self.settings.items() if k.startswith(FLAG_PREFIX)}

    def to_dict(self) -> dict[str, Any]:
        return {"schema": 1, "kind": KIND, "command": list(self.command), "settings": dict(self.settings),
                "flag_styles": dict(self.flag_styles), "targets": self.targets.to_dict()}


def save_plan(plan: Plan, path: str | Path, header: str = "", *, write: Callable[..., Path] | None = None) -> None:
    """Write the plan as YAML through `write` (a FileSet's, for a tune's outputs; atomically alone)."""
    import yaml

    from trainspeed.fileio import atomic_write_text

    text = yaml.safe_dump(plan.to_dict(), sort_keys=False, default_flow_style=False)
    (write or atomic_write_text)(Path(path), (header + "\n" if header else "") + text)


def load_plan(path: str | Path) -> Plan:
    """Read a settings file; a clear ConfigError for a missing file, bad YAML or a wrong kind."""
    import yaml

    from trainspeed.fileset import complete_pending

    p = Path(path)
    complete_pending(p.parent)  # a tune killed between renaming its outputs: finish them first (fileset.py)
    if not p.is_file():
        raise ConfigError(f"--with {path}: no such file. Give the best.yaml a script tune wrote "
                          "(trainspeed tune --out DIR -- python train.py ... writes DIR/best.yaml)")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"--with {path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ConfigError(f"--with {path}: not a script settings file (kind: {KIND}); a trainspeed "
                          "config runs with `trainspeed train CONFIG` instead")
    if data.get("schema") != 1:
        raise ConfigError(f"--with {path}: settings schema {data.get('schema')!r} is not supported "
                          "by this trainspeed (it reads schema 1); upgrade trainspeed")
    settings = data.get("settings") or {}
    if not isinstance(settings, dict):
        raise ConfigError(f"--with {path}: 'settings' must be a mapping, got {type(settings).__name__}")
    if any(not str(k).startswith(FLAG_PREFIX) for k in settings):
        from trainspeed.patches import validate_settings

        validate_settings(settings)
    return Plan(command=[str(c) for c in data.get("command") or []], settings=settings,
                targets=Targets.from_dict(data.get("targets")),
                flag_styles={str(k): str(v) for k, v in (data.get("flag_styles") or {}).items()})


def render_flag(option: str, value: Any, style: str) -> list[str]:
    """The command-line words of one flag: `--x 1`, `--x=1`, bare `--x` (none when False), or
    a store_false `--no_x` (given when False, as script_flags.set_flag says it)."""
    if style == "bare":
        return [option] if value else []
    if style == "negated":
        return [] if value else [option]
    text = str(value)
    return [f"{option}={text}"] if style == "equals" else [option, text]


def flag_style(option: str, styles: dict[str, str] | None, command: list[str]) -> str:
    """How `option` is written: its recorded style, else `=` when the command already writes
    it so, else `--x 1`."""
    return (styles or {}).get(option) or ("equals" if any(a.startswith(option + "=") for a in command)
                                          else "space")


def _takes_value(token: str) -> bool:
    """Whether the word after a flag is its value (`--lr -1e-3` is; `--amp --lr` is not)."""
    if not token.startswith("-"):
        return True
    try:
        float(token)
        return True
    except ValueError:
        return False


def set_flag(command: list[str], option: str, words: list[str]) -> list[str]:
    """The command with `option` written as `words`: its first occurrence (`--x 1`, `--x=1`,
    bare `--x`) is replaced in place and later ones removed; a missing one is appended. Empty
    `words` remove the option (a bare flag set to False)."""
    out = list(command)
    where = None
    i = 0
    while i < len(out):
        arg = out[i]
        if arg == option or arg.startswith(option + "="):
            with_value = len(words) > 1 or (bool(words) and "=" in words[0])
            width = 2 if arg == option and with_value and i + 1 < len(out) and _takes_value(out[i + 1]) else 1
            del out[i:i + width]
            where = i if where is None else where
            continue
        i += 1
    at = len(out) if where is None else where
    out[at:at] = words
    return out


def apply_flags(command: list[str], flags: dict[str, Any], styles: dict[str, str] | None = None) -> list[str]:
    """The command with each flag set to its value, in the script's own style (set_flag)."""
    out = list(command)
    for option, value in flags.items():
        out = set_flag(out, option, render_flag(option, value, flag_style(option, styles, out)))
    return out


def command_with_flags(command: list[str], flags: list[str]) -> list[str]:
    """The command with each flag as typed (`--workers 4`, `--compile=True`, `--compile`) set."""
    import shlex

    out = list(command)
    for flag in flags:
        words = shlex.split(flag)
        if words:
            # `--x=1`, and a Hydra override `data.num_workers=2`: the option is what precedes "="
            option = words[0].split("=", 1)[0] if words[0].startswith("-") or "=" in words[0] else words[0]
            out = set_flag(out, option, words)
    return out


__all__ = ["FLAG_PREFIX", "KIND", "Plan", "apply_flags", "command_with_flags", "flag_style", "load_plan",
           "render_flag", "save_plan", "set_flag"]
