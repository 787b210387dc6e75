"""The fast step-record encoder writes what schema.dumps writes, up to the digits it documents,
and hands every record it cannot write exactly to schema.dumps."""

from __future__ import annotations

import json
import math

import pytest

from trainspeed.sinks.step_lines import STEP_KEYS, step_lines
from trainspeed.telemetry import schema
from trainspeed.telemetry.records import step_records

pytestmark = pytest.mark.timeout(60)


def _records(losses, mem=None):
    """Records as the Monitor makes them (telemetry/records.py), one flush's worth."""
    n = len(losses)
    resolved = [(0.0123 + i * 1e-7, [0.001, 2e-9, 0.004, 0.005, 0.0011, 0.0, 0.0, 0.0]) for i in range(n)]
    rows = [(32, 1000 + i, 24, 3e-4, i % 2, i == 0, 100.0 + i, None if i % 2 or i == n - 1 else 5.0 + i) for i in range(n)]
    return step_records(resolved, rows, losses, first_step=41, wall_offset=1_793_000_000.123456,
                        mem=mem if mem is not None else {"rss": 123456789, "worker_rss": None}, rank=3,
                        cpu_before=4.5)


def _parse(text):
    return [json.loads(line) for line in text.splitlines()]


def _same(fast, exact):
    """Equal keys and values; floats to 9 significant digits (t_wall to the microsecond)."""
    assert list(fast) == list(exact)
    for key, value in exact.items():
        if isinstance(value, dict):
            _same(fast[key], value)
        elif isinstance(value, float):
            tol = 1e-6 if key == "t_wall" else abs(value) * 1e-8
            assert math.isclose(fast[key], value, abs_tol=tol), (key, fast[key], value)
        else:
            assert fast[key] == value, key


def test_monitor_records_read_back_as_schema_dumps_writes_them():
    records = _records([2.3025851249694824, 1.5, 0.1 + 0.2])
    assert tuple(records[0]) == STEP_KEYS  # the shape the fast path takes
    fast = _parse(step_lines(records))
    exact = _parse("".join(schema.dumps(r) + "\n" for r in records))
    assert len(fast) == 3
    for f, e in zip(fast, exact):
        _same(f, e)
    # the loss is exact (repr), not cut to 9 digits; None stays null; booleans stay booleans
    assert [f["loss"] for f in fast] == [2.3025851249694824, 1.5, 0.30000000000000004]
    assert fast[1]["cpu"] is None and fast[0]["warmup"] is True and fast[1]["warmup"] is False
    assert fast[0]["mem"] == {"rss": 123456789, "worker_rss": None}


def test_values_json_cannot_hold_or_other_shapes_take_the_general_path():
    records = _records([1.0] * 5)
    records[0]["loss"] = float("nan")  # step_records writes None; another writer might not
    records[1]["lr"] = float("inf")
    records[2]["phases"]["forward"] = float("nan")
    records[3]["step"] = 3.5  # %d would write 3
    records[4]["extra"] = "kept"  # a key step_records does not write
    lines = step_lines(records).splitlines()
    assert [line == schema.dumps(r) for line, r in zip(lines, records)] == [True] * 5
    parsed = _parse("\n".join(lines))
    assert parsed[0]["loss"] is None and parsed[1]["lr"] is None and parsed[2]["phases"]["forward"] is None
    assert parsed[3]["step"] == 3.5 and parsed[4]["extra"] == "kept"


def test_each_flush_writes_its_own_memory_figures():
    first, second = _records([1.0, 1.0], mem={"rss": 1}), _records([1.0], mem={"rss": 2})
    parsed = _parse(step_lines(first + second))
    assert [p["mem"]["rss"] for p in parsed] == [1, 1, 2]
