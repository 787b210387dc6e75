"""The script's own command-line flags: what its argparse parser accepts and what it parsed.

A finding about the eval interval or num_workers is most useful as the flag the user already
has (`--eval_interval 250`, pytorch/examples' `--workers 4`), and the script tuner varies such
flags instead of patching. `ArgumentParser.parse_known_args` (which `parse_args` calls) is
wrapped to record the first parse made from the user's code; nanoGPT-style scripts that read
`--key=value` from sys.argv without argparse get the same list built from their arguments.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from trainspeed.doctor.instrument.imports import PostImportHooks
from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.setting_rows import flags_from_argv, flatten_settings, plain_value, setting_rows
from trainspeed.doctor.instrument.sites import caller_site, format_site
from trainspeed.patches.callers import in_user_files

# Installed packages whose argparse parser holds their own options, never the script's:
# python-fire parses --verbose, --trace, --separator... with argparse and maps the script's
# flags onto the function's arguments itself (DeepSpeedExamples' HelloDeepSpeed: the doctor
# listed fire's six options as the script's).
# Hydra's parser (--help, --hydra-help, --multirun...) is its own too: a Hydra app's settings are
# its config's `key=value` overrides (hydra_flags.py).
_OWN_OPTION_PARSERS = (os.sep + "fire" + os.sep, os.sep + "hydra" + os.sep)


def _library_parser(filename: str) -> bool:
    return not in_user_files((filename, 0)) and any(marker in filename for marker in _OWN_OPTION_PARSERS)


def describe_parser(parser: argparse.ArgumentParser, namespace: Any) -> list[dict[str, Any]]:
    """One dict per optional flag: option, dest, parsed value, default, type, action kind."""
    rows: list[dict[str, Any]] = []
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list of actions
        if not action.option_strings or isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        option = max(action.option_strings, key=len)
        kind = type(action).__name__.lstrip("_").replace("Action", "").lower() or "store"
        rows.append({
            "option": option,
            "options": list(action.option_strings),
            "dest": action.dest,
            "value": plain_value(getattr(namespace, action.dest, None)),
            "default": plain_value(action.default),
            "type": getattr(action.type, "__name__", None) if action.type else None,
            "kind": kind,
            "choices": [plain_value(c) for c in action.choices] if action.choices else None,
            # what the flag counts, as its author wrote it ("steps ... per policy rollout": script_flags.py)
            **({"help": action.help[:200]} if isinstance(action.help, str) and action.help else {}),
            # `--torchcompile` alone means `--torchcompile inductor` (timm: nargs="?", const=...)
            **({"bare_value": plain_value(action.const)} if action.nargs == "?" and action.const is not None else {}),
        })
    return rows


def install(session: Session, patches: Patches, imports: PostImportHooks) -> None:
    def make(original: Any) -> Any:
        def parse_known_args(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            if session.on() and _may_record(session, self):
                where = caller_site(2)
                # a library's own parser (torch.distributed.run, fire's) is not the script's
                if where is not None and not _library_parser(where[0]):
                    _record(session, "argparse", format_site(*where), lambda: describe_parser(self, result[0]), more=True)
            return result

        parse_known_args.__wrapped__ = original  # type: ignore[attr-defined]
        return parse_known_args

    patches.wrap(argparse.ArgumentParser, "parse_known_args", make)
    imports.add("jsonargparse", lambda module: _wrap_jsonargparse(session, patches, module))


def _may_record(session: Session, parser: argparse.ArgumentParser) -> bool:
    """Whether a parse can add to the recorded flags: none recorded yet, or argparse's, from a
    parser with more options. timm's train.py parses twice: a `--config`-only parser's
    parse_known_args first, then the parser of its ~200 training options on the rest."""
    seen = session.observations.get("script_flags")
    if seen is None:
        return True
    return seen.get("source") == "argparse" and len(parser._actions) > len(seen.get("flags") or ())  # noqa: SLF001


def _record(session: Session, source: str, site: str | None, rows: Any, *, more: bool = False) -> None:
    """Observe the script's flags (`rows()`, None for none) at its first parse. With `more`, a
    later parse with more flags takes their place, with the earlier ones it does not have (timm's
    config parser, then its training options). Never breaks the parse."""
    seen = session.observations.get("script_flags")
    if not session.on() or (seen is not None and not more):
        return
    session.internal += 1
    try:
        flags = rows()
        if flags is None:
            pass
        elif seen is None:
            session.observe("script_flags", "script_flags", source=source, site=site, flags=flags)
        elif len(flags) > len(seen.get("flags") or ()):
            known = {row["option"] for row in flags}
            seen.update(site=site, flags=flags + [row for row in seen.get("flags") or () if row["option"] not in known])
    except Exception:  # noqa: BLE001 - the flags are advice; never break the parse
        pass
    finally:
        session.internal -= 1


def _parsed_settings(result: Any) -> list[dict[str, Any]]:
    """A jsonargparse Namespace's settings as flags: its subcommand's (`fit`) when it has one."""
    tree = result.as_dict()
    if isinstance(tree.get("subcommand"), str) and isinstance(tree.get(tree["subcommand"]), dict):
        tree = tree[tree["subcommand"]]
    return setting_rows(flatten_settings(tree))


def _wrap_jsonargparse(session: Session, patches: Patches, module: Any) -> None:
    """LightningCLI's parser (jsonargparse) never calls argparse's parse_known_args: its parsed
    config's keys are the script's flags, `--data.batch_size=32` (a subcommand's, after `fit`)."""
    parser = getattr(module, "ArgumentParser", None)
    if not isinstance(parser, type):
        return

    def make(original: Any) -> Any:
        def parse_args(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            _record(session, "jsonargparse", None, lambda: _parsed_settings(result) or None)
            return result

        parse_args.__wrapped__ = original  # type: ignore[attr-defined]
        return parse_args

    patches.wrap(parser, "parse_args", make)


def observe_argv_flags(session: Session, args: list[str], script: str | None = None,
                       namespace: dict[str, Any] | None = None, hydra_config: Any = None) -> None:
    """After the run: a script that parsed no argparse flags may read `--key=value` itself; a
    nanoGPT-style configurator (configurator.py) takes every global the script sets before it,
    typed or not; a minGPT-style config tree in its globals (`namespace`) every key it holds; a
    Hydra app every key of its composed config (`hydra_config`), as `key=value`."""
    if "script_flags" in session.observations:
        return
    from pathlib import Path

    from trainspeed.doctor.instrument.config_objects import config_object_flags
    from trainspeed.doctor.instrument.configurator import configurator_flags
    from trainspeed.doctor.instrument.hydra_flags import hydra_flags

    source, settable = "hydra", hydra_flags(hydra_config)
    if not settable:
        source, settable = "configurator", configurator_flags(Path(script), args, Path.cwd()) if script else []
    if not settable:
        source, settable = "config_object", config_object_flags(namespace)
    known = {row["dest"] for row in settable}
    rows = settable + [row for row in flags_from_argv(args) if row["dest"] not in known]
    if rows:
        session.observe("script_flags", "script_flags", source=source if settable else "argv",
                        site=None, flags=rows)
