"""trainspeed's own options typed after the script's command with no `--` before it.

Without `--`, everything from the script on is the script's: `trainspeed doctor python main.py
--steps 10` ran the default 200 steps and handed --steps 10 to main.py, which ignored it (a
script without argparse), and `trainspeed tune python main.py --budget 1m` tuned for the default
10 minutes. With `--` the split is the user's, so nothing is checked there.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Sequence

_SCRIPT_COMMANDS = ("doctor", "tune", "run")
_NOT_OURS = {"-h", "--help"}  # `python main.py --help` asks the script, as typed


def misplaced_options(sub: argparse.ArgumentParser, subcommand: str, argv: Sequence[str],
                      command: Sequence[str]) -> str | None:
    """The error for trainspeed options found inside `command` (the script's words, as parsed)
    when `argv` has no `--`; None when there are none, or `--` marks where the script starts."""
    if subcommand not in _SCRIPT_COMMANDS or "--" in argv or not command:
        return None
    own = {s for a in sub._actions for s in a.option_strings if s.startswith("--")} - _NOT_OURS  # noqa: SLF001
    names = [w.split("=", 1)[0] for w in command]
    found = [i for i in range(1, len(command)) if names[i] in own]
    if not found:
        return None
    at = found[0]  # the first is moved before `--` in the example (with its value, unless written --opt=value)
    taken = list(command[at:at + 2]) if "=" not in command[at] and at + 1 < len(command) else [command[at]]
    rest = [*command[:at], *command[at + len(taken):]]
    ours = f"trainspeed {subcommand} {shlex.join(taken)} -- {shlex.join(rest)}"
    theirs = f"trainspeed {subcommand} -- {shlex.join(command)}"
    return (f"{', '.join(sorted({names[i] for i in found}))} follows the script's command with no `--` "
            f"before it, so it would go to the script, not to trainspeed. For trainspeed: {ours}; "
            f"if it is the script's own option: {theirs}")


__all__ = ["misplaced_options"]
