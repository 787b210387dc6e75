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


_MULTI_PROCESS_FLAGS = ("--multi_gpu",)
"""accelerate launch flags that ask for several processes, left out of a one-process launch."""


def one_process_launch(launcher: Sequence[str]) -> list[str]:
    """`accelerate launch --num_processes 2 --mixed_precision bf16` as typed, with one process:
    `--num_processes 1` in place of the count and --multi_gpu out; every other option (the
    precision, --cpu, a config file) stays, so the tune measures the run the user launches."""
    words = list(launcher[:2])
    rest = list(launcher[2:])
    while rest:
        word = rest.pop(0)
        if word in ("--num_processes", "--num-processes"):
            if rest:
                rest.pop(0)
        elif word.startswith(("--num_processes=", "--num-processes=")) or word in _MULTI_PROCESS_FLAGS:
            pass
        else:
            words.append(word)
    return words[:2] + ["--num_processes", "1"] + words[2:]


__all__ = ["PYTHON_NAME", "is_interpreter", "one_process_launch", "script_words"]
