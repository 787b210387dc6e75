"""The tune's tables laid out for the width they print at.

Eleven columns with boxed borders and a note of up to 60 characters need about 200 columns; a
terminal that wide gets the table as it is. Narrower (a laptop's terminal, a log at rich_console's
pipe width): each note leaves the table for a numbered line under it, the borders thin to a rule
under the header, and the words fold inside their columns. At 110 columns the boxed table had
given the setting and the note no width at all and cut the verdict off ("no measurable chang").
"""

from __future__ import annotations

from typing import Any, Sequence

from trainspeed.tune.result import Row

RIGHT = ("at stake", "speedup", "noise", "memory", "loss delta")
"""Columns of figures, aligned on the right (table.NUMERIC, for the HTML too)."""
NUMBERS = (*RIGHT, "95% CI")
"""Columns of short figures: never folded (a number split over two lines reads as two)."""
UNLIMITED = 10_000
"""A width no table reaches: to measure the one the boxed table wants."""
NARROW_MIN = {"knob": 10, "setting": 12, "one-time": 8, "verdict": 9}
"""Widths the columns of words keep in a narrow table: rich would squeeze them to nothing."""
KEPT = ("knob", "setting", "speedup", "verdict")
"""Columns a narrow table always shows: what was measured and what it read."""
DROP_FIRST = ("one-time", "memory", "noise", "at stake", "loss delta", "95% CI")
"""Where a narrow table's figures still do not fit, the columns left out first."""


def _boxed(title: str, rows: Sequence[Row], columns: Sequence[str], cells: Any, style: dict[str, str]) -> Any:
    """The table as it prints on a wide terminal."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in columns:
        t.add_column(col, justify="right" if col in RIGHT else "left",
                     overflow="fold", max_width=60 if col in ("note", "setting") else None,
                     min_width=20 if col == "setting" else None,  # `run.threads=1` folds whole
                     # a verified combination names every setting: it wraps, or the number
                     # columns would be squeezed to one character
                     no_wrap=col not in ("note", "setting", "one-time"))
    for row in rows:
        t.add_row(*cells(row), style=style.get(row.verdict, ""))
    return t


def _compact(title: str, columns: Sequence[str], widths: Sequence[int] | None = None) -> Any:
    """An empty narrow table: one rule under the header, no box, one space between columns."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
              collapse_padding=True)
    for i, col in enumerate(columns):
        t.add_column(col, justify="right" if col in RIGHT else "left", overflow="fold",
                     no_wrap=col in NUMBERS, width=widths[i] if widths else None)
    return t


def _widths(console: Any, columns: Sequence[str], natural: dict[str, int], width: int) -> list[int] | None:
    """Each column's width in `width` columns: the figures their own, the words at least
    NARROW_MIN, and the rest shared out so that a short column (a knob's name) is whole before
    a long one (a combination's settings) grows; None where the least does not fit. Set by hand:
    rich, short of room, narrows every column alike and cuts the figures."""
    from rich.measure import Measurement

    ones = _compact("", columns, [1] * len(columns))  # what the spacing between columns takes
    room = width - (Measurement.get(console, console.options.update_width(UNLIMITED), ones).maximum - len(columns))
    widths = {c: natural[c] if c in NUMBERS else min(natural[c], NARROW_MIN.get(c, 8)) for c in columns}
    spare = room - sum(widths.values())
    if spare < 0:
        return None
    growing = sorted((c for c in columns if widths[c] < natural[c]), key=lambda c: natural[c] - widths[c])
    while spare > 0 and growing:
        share = spare // len(growing)
        want = natural[growing[0]] - widths[growing[0]]
        if want <= share:  # the shortest wish fits in an equal share: grant it whole
            widths[growing[0]] += want
            spare -= want
            growing.pop(0)
            continue
        for i, c in enumerate(growing):  # every wish is longer than a share: equal shares
            widths[c] += share + (1 if i < spare - share * len(growing) else 0)
        break
    return [widths[c] for c in columns]


def _narrow(console: Any, title: str, rows: Sequence[Row], columns: Sequence[str], cells: Any,
            style: dict[str, str]) -> tuple[Any, list[str]]:
    """The table without a box, its words folding to fit the console; each row's note numbered
    beside its verdict (`no measurable change [1]`) and returned to print under it; the columns
    no row fills (all "—": no doctor run, no one-time cost) left out, and where even then the
    figures do not fit, the least read ones (DROP_FIRST), said so."""
    from rich.cells import cell_len

    note_at, verdict_at = columns.index("note"), columns.index("verdict")
    notes: list[str] = []
    table_rows = []
    for row in rows:
        values = cells(row)
        if values[note_at]:
            notes.append(f"[{len(notes) + 1}] {row.knob} {row.setting}: {values[note_at]}")
            values[verdict_at] += f" [{len(notes)}]"
        table_rows.append((dict(zip(columns, values)), style.get(row.verdict, "")))
    kept = [c for c in columns if c != "note" and (c in KEPT or any(v[c] not in ("", "—") for v, _ in table_rows))]
    natural = {c: max([cell_len(c), *(cell_len(v[c]) for v, _ in table_rows)]) for c in kept}
    left_out: list[str] = []
    widths = _widths(console, kept, natural, console.width)
    for col in DROP_FIRST:
        if widths is not None:
            break
        if col in kept:
            kept.remove(col)
            left_out.append(col)
            widths = _widths(console, kept, natural, console.width)
    t = _compact(title, kept, widths)
    for values, row_style in table_rows:
        t.add_row(*(values[c] for c in kept), style=row_style)
    if left_out:
        notes.append(f"(left out at {console.width} columns: {', '.join(left_out)}; tune.html and tune.json "
                     "hold every column)")
    return t, notes


def fitted_table(console: Any, title: str, rows: Sequence[Row], columns: Sequence[str], cells: Any,
                 style: dict[str, str]) -> tuple[Any, list[str]]:
    """The boxed table where its full width fits the console, else the narrow one with its notes
    apart: (the rich Table, the note lines to print under it)."""
    from rich.measure import Measurement

    boxed = _boxed(title, rows, columns, cells, style)
    # measured without the console's limit: rich fits any table into the width it is given
    natural = Measurement.get(console, console.options.update_width(UNLIMITED), boxed).maximum
    if natural <= console.width:
        return boxed, []
    return _narrow(console, title, rows, columns, cells, style)


__all__ = ["fitted_table"]
