"""The one place the CLI makes its rich Consoles, so every table and report takes the same width.

On a terminal rich measures the terminal, and that is right. Into a pipe or a file (`| tee log`,
`> log`, CI, nohup) there is no terminal to measure: rich falls back to 80 columns, and the tune
table once forced 240, which wraps into garbage in most log viewers and in mail. There the width
is $COLUMNS when set (the user's own choice), else PIPE_WIDTH, and the tables fold their cells
to fit it (tune/table.py, report/terminal.py).
"""

from __future__ import annotations

import os
from typing import IO, Any, Mapping

PIPE_WIDTH = 110
"""Columns of output that goes to a pipe or file without $COLUMNS: what a log viewer, a CI page
and a mail show without wrapping, and wide enough for the tune table's numbers on one line."""
MIN_WIDTH = 40
"""Narrower $COLUMNS is read as a mistake (COLUMNS=0 from a shell without a terminal)."""


def pipe_width(environ: Mapping[str, str] | None = None) -> int:
    """The width of output that is not going to a terminal: $COLUMNS when it is a sensible
    number, else PIPE_WIDTH."""
    columns = (os.environ if environ is None else environ).get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) >= MIN_WIDTH:
        return int(columns)
    return PIPE_WIDTH


def new_console(*, stderr: bool = False, file: IO[str] | None = None, **options: Any) -> Any:
    """A rich Console for the CLI's output: the terminal's own width on a terminal, pipe_width()
    elsewhere. `options` go to rich (record=True in tests)."""
    from rich.console import Console

    console = Console(stderr=stderr, file=file, **options)
    if not console.is_terminal and "width" not in options:
        console.width = pipe_width()
    return console


__all__ = ["MIN_WIDTH", "PIPE_WIDTH", "new_console", "pipe_width"]
