"""Which of a knob's winning settings the greedy combination tries on top of the winners so far.

A knob's setting may also set another knob's value: on a CPU, num_workers offers "1 + 1 compute
threads" (its workers and torch.set_num_threads splitting the cores). The greedy step used to
keep one row per knob, the fastest, and skip the knob whenever that row set any key the bigger
winners had set. `make demo` (2 cores) measured threads=1 at 3.83x, num_workers "1 + 1 compute
threads" at 3.36x and num_workers=1 at 2.49x: num_workers was skipped, "sets threads, already
set by a bigger winner", though its threads=1 was the very value already chosen, and
best.patch held threads=1 alone while the run stayed data-bound.

Here a key set to the value already chosen is no conflict, and a knob whose fastest winner
does conflict falls back to its next winner that does not (num_workers=1 beside threads=2).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from trainspeed.tune import stats
from trainspeed.tune.result import Row


def conflicts(settings: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The keys `settings` would set to another value than `current` holds."""
    return sorted(k for k, v in settings.items() if k in current and current[k] != v)


def winners_by_knob(rows: Iterable[Row], is_whatif: Callable[[dict[str, Any]], bool]) -> list[list[Row]]:
    """Each knob's settings measured faster, fastest first; the knobs in order of their
    fastest (the greedy order). What-ifs are reported, never combined (search.Tuner)."""
    by_knob: dict[str, list[Row]] = {}
    for row in rows:
        if row.verdict == stats.FASTER and not is_whatif(row.settings):
            by_knob.setdefault(row.knob, []).append(row)
    ranked = [sorted(rows_, key=lambda r: -(r.speedup or 0)) for rows_ in by_knob.values()]
    return sorted(ranked, key=lambda rows_: -(rows_[0].speedup or 0))


def choose(rows: list[Row], current: dict[str, Any]) -> tuple[Row | None, list[Row]]:
    """(the knob's fastest winner that agrees with `current`, or None; a note row for its
    fastest winner where that one was passed over for a conflict)."""
    passed: tuple[Row, list[str]] | None = None
    chosen = None
    for row in rows:
        clash = conflicts(row.settings, current)
        if not clash:
            chosen = row
            break
        passed = passed or (row, clash)
    if passed is None:
        return chosen, []
    row, clash = passed
    note = f"not combined: sets {', '.join(clash)}, already set by a bigger winner"
    if chosen is not None:
        note += f"; {chosen.knob}={chosen.setting} is tried instead"
    return chosen, [Row(knob=row.knob, setting=row.setting, settings=row.settings, note=note)]


def already_in(row: Row) -> Row:
    """The row of a winner whose every setting a bigger winner already brought in."""
    return Row(knob=row.knob, setting=row.setting, settings=row.settings,
               note="already in the combination: a bigger winner set the same values")


__all__ = ["already_in", "choose", "conflicts", "winners_by_knob"]
