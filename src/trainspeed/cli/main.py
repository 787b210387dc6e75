"""`trainspeed` entry point: only delegates to one module per subcommand.

Each subcommand module defines `register(subparsers)` (adds its parser, keeps imports light)
and `run(args) -> int`. Heavy imports (torch, matplotlib) happen inside `run`, so `--help`
stays instant.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

from trainspeed import __version__
from trainspeed.errors import NO_SPACE_ERRNOS, TrainspeedError

_CANNOT_WRITE = NO_SPACE_ERRNOS | {errno.EROFS}
# Subcommand name -> module. A module that is not there yet is simply not offered.
SUBCOMMANDS = ("train", "doctor", "tune", "run", "report", "env", "recipes")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainspeed",
        description="Make PyTorch training fast, and prove it with measurements.",
    )
    parser.add_argument("--version", action="version", version=f"trainspeed {__version__}")
    # dest is not "command": doctor and run keep the training command under that name, and an
    # empty one (`trainspeed doctor`) read as "no subcommand" printed the top-level help.
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"trainspeed.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"trainspeed.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def unknown_command(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The error for a first word that is no subcommand (`trainspeed trian`), with a "did you
    mean"; None when the first word is a subcommand or an option."""
    import difflib

    if not argv or argv[0].startswith("-"):
        return None
    commands = next((list(a.choices) for a in parser._actions  # noqa: SLF001 - argparse has no public accessor
                     if isinstance(a, argparse._SubParsersAction)), [])  # noqa: SLF001
    if argv[0] in commands:
        return None
    close = difflib.get_close_matches(argv[0], commands, n=1, cutoff=0.5)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"unknown command '{argv[0]}'; {hint}commands: {', '.join(commands)} (trainspeed --help)"


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:  # noqa: SLF001 - argparse has no public accessor
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return action.choices.get(name)
    return None


def unknown_options(sub: argparse.ArgumentParser, extras: list[str]) -> str:
    """The error for options a subcommand does not take (`doctor --stpes 5`), each with its
    closest known option: said by the subcommand, not by the top-level usage."""
    import difflib

    known = [s for a in sub._actions for s in a.option_strings if s.startswith("--")]  # noqa: SLF001
    parts = []
    for arg in extras:
        if not arg.startswith("-"):
            continue
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        parts.append(f"unknown option {name}" + (f"; did you mean {close[0]}?" if close else ""))
    if not parts:
        parts.append(f"unexpected arguments: {' '.join(extras)}")
    return "; ".join(parts) + f" (options: {sub.prog} --help)"


VALUED = ("--budget", "--trial-timeout", "--min-effect", "--loss-tolerance")
"""Options whose value a user may write with a sign: argparse reads `--budget -5m` as two options
("expected one argument"); joined, the value's own check says what is wrong with it."""


def _joined_values(argv: list[str]) -> list[str]:
    """`--budget -5m` -> `--budget=-5m` (before the script's command, after `--`, nothing changes)."""
    end = argv.index("--") if "--" in argv else len(argv)
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if i < end - 1 and word in VALUED and argv[i + 1].startswith("-") and argv[i + 1] != "--":
            out.append(f"{word}={argv[i + 1]}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    own_process = argv is None
    argv = _joined_values(sys.argv[1:] if argv is None else list(argv))
    wrong = unknown_command(parser, argv)
    if wrong:
        print(f"trainspeed: error: {wrong}", file=sys.stderr)
        return 2
    args, extras = parser.parse_known_args(argv)
    if not getattr(args, "subcommand", None):
        parser.print_help()
        return 2
    sub = _subparser(parser, args.subcommand)
    if extras and sub is not None:
        sub.print_usage(sys.stderr)
        print(f"{sub.prog}: error: {unknown_options(sub, extras)}", file=sys.stderr)
        return 2
    args.argv = argv  # what was typed: an interrupted tune prints the command that resumes it
    if sub is not None:
        from trainspeed.cli._misplaced import misplaced_options

        from trainspeed.cli.tune import is_script_command

        # a tune of a recipe or config reads its options from among the overrides after it
        words = getattr(args, "command", None) if args.subcommand != "tune" else (
            [args.target, *args.rest] if is_script_command(getattr(args, "target", None)) else [])
        misplaced = misplaced_options(sub, args.subcommand, argv, [str(w) for w in words or []])
        if misplaced:
            print(f"{sub.prog}: error: {misplaced}", file=sys.stderr)
            return 2
    # The process is trainspeed's own (`trainspeed ...`, `python -m trainspeed`), not a host
    # calling main([...]) as a function (a test, a notebook): process-wide settings such as
    # startup.preload's gc.freeze are made only then.
    args.own_process = own_process
    try:
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # a closed reader shows here, not at exit as an unraisable error
        return code
    except BrokenPipeError:
        return _reader_gone(own_process)
    except TrainspeedError as exc:
        print(f"trainspeed: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)  # DiskFullError: 28 (ENOSPC)
    except OSError as exc:
        if exc.errno not in _CANNOT_WRITE:
            raise
        # `trainspeed report RUN` on a full disk, a run directory on a read-only mount: one line
        where = f" {exc.filename}" if exc.filename else ""
        print(f"trainspeed: error: cannot write{where}: {exc.strerror}", file=sys.stderr)
        return 28 if exc.errno == errno.ENOSPC else 1
    except KeyboardInterrupt as exc:
        if not getattr(exc, "reported", False):  # the engine's stop line said it already
            print("trainspeed: interrupted", file=sys.stderr)
        return getattr(exc, "exit_code", 130)  # 128 + the signal (a tune's SIGTERM: 143), Ctrl-C 130


def _reader_gone(own_process: bool) -> int:
    """The output's reader stopped early (`trainspeed report RUN --json | head -c 400`): quiet, as
    other CLIs are. Python's documented way: what is left in stdout's buffer goes to devnull, so
    the flush at exit fails no more; status 1, Python's own for EPIPE."""
    import os

    if own_process:  # a host's stdout (a test's capture) is left alone
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
