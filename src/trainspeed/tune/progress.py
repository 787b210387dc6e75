"""The tune's progress lines (each trial, each round, what the baseline saw, how long trials run)
at the width of where they go.

They were printed as single lines of 150-300 characters. On a terminal that wraps them itself
(mid-word, figures cut across lines); into a pipe or a file (`trainspeed tune ... | tee log`, CI,
nohup) nothing wraps them, and a log viewer or a mail shows one line far past the tables beside
it, which already fit rich_console's width. Here every line is folded at that width: the
terminal's own (measured at each line, a resized window included), else $COLUMNS or PIPE_WIDTH.
A line folds at word boundaries, never inside a word nor between a figure and its unit, so no
figure (`1.02x`, `0.94-1.09`, `175 ms`, `train.py:34`) is split or lost; a clause break (`; `)
is taken where one lies near the end, so a long line reads as its headline, then its details.
The continuation lines are indented 4 past the line's own indent. A single word longer than the
width (a long path) stays whole: a path cut in two cannot be copied.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import IO, Callable

from trainspeed.rich_console import pipe_width

CONTINUATION = 4
"""Columns a folded line's continuation is indented past the line's own indent."""
CLAUSE_REACH = 0.6
"""A clause break (`; `) is where a line folds when it lies past this share of the width:
earlier, it would leave a short line and a long one."""


def fold(line: str, width: int) -> list[str]:
    """`line` as lines of at most `width` columns (but for a word longer than that), folded at
    spaces, preferring a clause break near the end; continuation lines indented CONTINUATION
    past the line's own indent. Joining the parts' stripped text with single spaces gives the
    line back (its inner spaces are single at every fold)."""
    line = line.rstrip()
    if len(line) <= width:
        return [line]
    indent = line[: len(line) - len(line.lstrip(" "))]
    rest, prefix, out = line[len(indent):], indent, []
    more = indent + " " * CONTINUATION
    while len(prefix) + len(rest) > width:
        room = width - len(prefix)
        cut = _fold_point(rest, room)
        if cut is None:  # one word longer than the room: kept whole on its own line
            cut = rest.find(" ")
            if cut < 0:
                break
        out.append(prefix + rest[:cut].rstrip())
        rest, prefix = rest[cut:].lstrip(" "), more
    out.append(prefix + rest)
    return out


def _fold_point(text: str, room: int) -> int | None:
    """Where `text` folds to fit `room` columns: after the last clause break past CLAUSE_REACH
    of the room, else at the last space that fits; None when its first word does not fit."""
    head = text[: room + 1]  # a space right at the edge still folds there
    clause = head.rfind("; ")
    if clause >= 0 and clause + 1 >= CLAUSE_REACH * room and clause + 1 <= room:
        return clause + 1
    spaces = [m.start() for m in re.finditer(" ", head) if m.start() > 0 and not _UNIT_SPACE.match(text, m.start())]
    return spaces[-1] if spaces else None


_UNIT_SPACE = re.compile(r"(?<=\d) (?:ms|s|us|µs|min|h|GiB|MiB|KiB|GB|MB|KB)\b")
"""A space between a figure and its unit (`175 ms`): not a fold point, the two read as one."""


def line_width(stream: IO[str]) -> int | None:
    """Where `stream` goes: the terminal's width, or pipe_width() for a pipe or a file; None
    when a terminal cannot say (left as is: the terminal wraps)."""
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        terminal = False
    if not terminal:
        return pipe_width()
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return None


@dataclass(slots=True)
class ProgressPrinter:
    """The tune's `say`: prints each line of the text folded to the stream's width, flushed (a
    tune's progress is watched through pipes and logs, and a line held in a buffer is none)."""

    stream: IO[str] | None = None
    """Where the lines go (None: sys.stdout at each call, so a redirect made later is honoured)."""
    width: Callable[[IO[str]], int | None] = line_width
    """The width to fold at for the stream (None: leave the lines as they are)."""

    def __call__(self, text: str) -> None:
        stream = self.stream or sys.stdout
        width = self.width(stream)
        lines = str(text).split("\n")
        folded = [part for line in lines for part in (fold(line, width) if width else [line])]
        print("\n".join(folded), file=stream, flush=True)


__all__ = ["CLAUSE_REACH", "CONTINUATION", "ProgressPrinter", "fold", "line_width"]
