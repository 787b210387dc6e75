"""The words of a training command: which one starts the interpreter, and the script's part.

Pure and import-free, so the doctor's runner, its checks (a finding's verify command is built
from the recorded command) and the CLI all read a command the same way without importing each
other.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Sequence

PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?(\.exe)?$")
"""An interpreter's file name (python, python3.11, python.exe): what starts a command."""
# Interpreter options that take a value (python -W error -X dev train.py ...).
_OPTS_WITH_VALUE = {"-W", "-X", "-Q"}


def is_interpreter(word: str) -> bool:
    """`python`, `python3.11`, `/usr/bin/python3` or this interpreter's own path."""
    return bool(PYTHON_NAME.match(os.path.basename(word))) or word == sys.executable


def script_words(command: Sequence[str]) -> list[str]:
    """The command past the interpreter and its options: `train.py ARGS`, `-m mod ARGS` (or
    `-c CODE ...`) out of `python [opts] ...`; a command without an interpreter as it is."""
    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv and is_interpreter(argv[0]):
        argv = argv[1:]
        while argv and argv[0].startswith("-") and argv[0] not in ("-m", "-c"):
            if argv.pop(0) in _OPTS_WITH_VALUE and argv:
                argv.pop(0)
    return argv


__all__ = ["PYTHON_NAME", "is_interpreter", "script_words"]
