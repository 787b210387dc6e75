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
from typing import Any

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
    """option -> "space" (`--workers 4`), "equals" (`--compile=True`) or "bare" (`--compile`)."""

    def patch_settings(self) -> dict[str, Any]:
        return {k: v for k, v in self.settings.items() if not k.startswith(FLAG_PREFIX)}

    def flags(self) -> dict[str, Any]:
        return {k[len(FLAG_PREFIX):]: v for k, v in self.settings.items() if k.startswith(FLAG_PREFIX)}

    def to_dict(self) -> dict[str, Any]:
        return {"schema": 1, "kind": KIND, "command": list(self.command), "settings": dict(self.settings),
                "flag_styles": dict(self.flag_styles), "targets": self.targets.to_dict()}


def save_plan(plan: Plan, path: str | Path, header: str = "") -> None:
    import yaml

    from trainspeed.fileio import atomic_write_text

    text = yaml.safe_dump(plan.to_dict(), sort_keys=False, default_flow_style=False)
    atomic_write_text(Path(path), (header + "\n" if header else "") + text)


def load_plan(path: str | Path) -> Plan:
    """Read a settings file; a clear ConfigError for a missing file, bad YAML or a wrong kind."""
    import yaml

    p = Path(path)
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


def _render(option: str, value: Any, style: str) -> list[str]:
    if style == "bare":
        return [option] if value else []
    text = str(value)
    return [f"{option}={text}"] if style == "equals" else [option, text]


def apply_flags(command: list[str], flags: dict[str, Any], styles: dict[str, str] | None = None) -> list[str]:
    """The command with each flag set: an occurrence (`--x 1` or `--x=1`) is replaced in
    place, a missing one appended. A bare flag (store_true) set to False is removed."""
    styles = styles or {}
    out = list(command)
    for option, value in flags.items():
        style = styles.get(option) or ("equals" if any(a.startswith(option + "=") for a in out) else "space")
        new = _render(option, value, style)
        for i, arg in enumerate(out):
            if arg == option:
                takes_value = style != "bare" and i + 1 < len(out)
                out[i:i + (2 if takes_value else 1)] = new
                break
            if arg.startswith(option + "="):
                out[i:i + 1] = new
                break
        else:
            out += new
    return out


__all__ = ["FLAG_PREFIX", "KIND", "Plan", "apply_flags", "load_plan", "save_plan"]
