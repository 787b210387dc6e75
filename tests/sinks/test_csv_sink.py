from __future__ import annotations

import csv
from pathlib import Path

import pytest

from trainspeed.sinks import CsvSink
from trainspeed.sinks.csv_sink import STEPS_CSV, cell, flatten
from trainspeed.telemetry import schema

pytestmark = pytest.mark.timeout(30)


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_flatten_names() -> None:
    flat = flatten({"step": 3, "phases": {"forward": 0.5}, "mem": {"rss": 10}})
    assert flat == {"step": 3, "phase_forward": 0.5, "mem_rss": 10}


def test_cells() -> None:
    assert cell(None) == "" and cell(float("nan")) == "" and cell(True) == 1
    assert cell(0.1) == "0.1" and cell([1, 2]) == "[1,2]" and cell("a") == "a"


def test_header_fixed_by_first_record_plus_all_phases(tmp_path: Path) -> None:
    sink = CsvSink(tmp_path)
    sink.write_steps([{"step": 0, "t_step": 0.5, "phases": {"forward": 0.25}, "mem": {"rss": 7}}])
    # a later key that was not in the first record is ignored; a missing one is empty
    sink.write_steps([{"step": 1, "phases": {"data": 0.125}, "loss": 2.5, "warmup": True}])
    sink.close()
    path = tmp_path / STEPS_CSV
    header = path.read_text().splitlines()[0].split(",")
    assert header == ["step", "t_step"] + [f"phase_{p}" for p in schema.PHASES] + ["mem_rss"]
    rows = read_rows(path)
    assert rows[0]["phase_forward"] == "0.25" and rows[0]["mem_rss"] == "7"
    assert rows[0]["phase_data"] == ""
    assert rows[1]["phase_data"] == "0.125" and rows[1]["t_step"] == ""
    assert "loss" not in rows[1] and "warmup" not in rows[1]


def test_resumed_run_reuses_the_existing_header(tmp_path: Path) -> None:
    sink = CsvSink(tmp_path)
    sink.write_steps([{"step": 0, "loss": 1.0}])
    sink.close()
    sink = CsvSink(tmp_path)
    sink.write_steps([{"step": 1, "lr": 0.1, "loss": 0.5}])
    sink.close()
    lines = (tmp_path / STEPS_CSV).read_text().splitlines()
    assert sum(1 for line in lines if line.startswith("step,")) == 1  # one header
    rows = read_rows(tmp_path / STEPS_CSV)
    assert [(r["step"], r["loss"]) for r in rows] == [("0", "1.0"), ("1", "0.5")]


def test_events_are_ignored(tmp_path: Path) -> None:
    sink = CsvSink(tmp_path)
    sink.write_event(schema.make_event("eval", 1, 0.0))
    sink.close()
    assert (tmp_path / STEPS_CSV).read_text() == ""
