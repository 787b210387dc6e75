"""CsvSink: <run_dir>/steps.csv with flat columns, for spreadsheets and pandas.

Columns are fixed by the first record (nested keys flattened: phases.forward ->
`phase_forward`, mem.rss -> `mem_rss`) plus a column for every name in schema.PHASES, so a
file always has the same phase columns whichever phases the first step happened to use.
Keys that first appear later are ignored (a CSV header cannot grow). When appending to an
existing steps.csv (a resumed run) its header is reused.

Rows are written like the JSONL sink: a batch is encoded first and appended with one
`os.write`, so a killed run never leaves half a row.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path
from typing import Any

from trainspeed.sinks.jsonl import open_append, write_all
from trainspeed.telemetry import schema

STEPS_CSV = "steps.csv"


def flatten(record: dict[str, Any]) -> dict[str, Any]:
    """One level of nesting flattened with '_': {"phases": {"data": 1}} -> {"phase_data": 1}."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            prefix = "phase" if key == "phases" else key
            for sub, subvalue in value.items():
                flat[f"{prefix}_{sub}"] = subvalue
        else:
            flat[key] = value
    return flat


def columns_for(first: dict[str, Any]) -> list[str]:
    """The header: the first record's flattened keys, with one column per schema.PHASES
    (in PHASES order, then any extra phase names) where its first phase column was."""
    keys = list(flatten(first))
    phase_cols = [f"phase_{p}" for p in schema.PHASES]
    phase_cols += [k for k in keys if k.startswith("phase_") and k not in phase_cols]
    others = [k for k in keys if not k.startswith("phase_")]
    at = next((i for i, k in enumerate(keys) if k.startswith("phase_")), len(keys))
    at = sum(1 for k in keys[:at] if not k.startswith("phase_"))
    return others[:at] + phase_cols + others[at:]


def cell(value: Any) -> Any:
    """CSV cell text: None/NaN -> empty, bools as 0/1, lists/dicts as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(schema.sanitize_any(value), separators=(",", ":"))
    return value


class CsvSink:
    """Append flattened step records to <run_dir>/steps.csv. Events are not written here."""

    name = "csv"

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / STEPS_CSV
        self.columns: list[str] | None = _existing_header(self.path)
        self._fd: int | None = open_append(self.path)

    def write_steps(self, records: list[dict[str, Any]]) -> None:
        if not records or self._fd is None:
            return
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        if self.columns is None:
            self.columns = columns_for(records[0])
            writer.writerow(self.columns)
        for record in records:
            flat = flatten(record)
            writer.writerow([cell(flat.get(c)) for c in self.columns])
        write_all(self._fd, buf.getvalue().encode("utf-8"))

    def write_event(self, event: dict[str, Any]) -> None:
        pass  # events live in events.jsonl; a CSV of heterogeneous events helps nobody

    def flush(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is None:
            return
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = None


def _existing_header(path: Path) -> list[str] | None:
    """The header of a non-empty steps.csv we are appending to, else None."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            row = next(csv.reader(f), None)
    except (FileNotFoundError, UnicodeDecodeError, csv.Error):
        return None
    return row or None
