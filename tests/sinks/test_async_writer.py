from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trainspeed.errors import ConfigError
from trainspeed.sinks import AsyncWriter, JsonlSink
from trainspeed.telemetry import schema

pytestmark = pytest.mark.timeout(60)


def rec(step: int) -> dict:
    return {"schema": 1, "step": step, "t_step": 0.01, "phases": dict.fromkeys(schema.PHASES, 0.0)}


class ListSink:
    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.events: list[dict] = []
        self.flushes = 0
        self.closed = 0

    def write_steps(self, records):
        self.steps.extend(records)

    def write_event(self, event):
        self.events.append(event)

    def flush(self):
        self.flushes += 1

    def close(self):
        self.closed += 1


class GatedSink(ListSink):
    """Blocks in write_steps until released: a sink far slower than training."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def write_steps(self, records):
        self.entered.set()
        self.release.wait(30)
        super().write_steps(records)


class RaisingSink(ListSink):
    name = "boom"

    def write_steps(self, records):
        raise OSError("disk on fire")

    def write_event(self, event):
        raise RuntimeError("still on fire")


def test_records_and_events_arrive_in_order_and_flush_waits() -> None:
    sink = ListSink()
    w = AsyncWriter([sink])
    for i in range(100):
        assert w.submit_steps([rec(i)])
    assert w.submit_event(schema.make_event("checkpoint", 99, 0.0, path="p"))
    assert w.flush(timeout=10)
    # flush returned only after the sink saw everything and was flushed
    assert [r["step"] for r in sink.steps] == list(range(100))
    assert sink.events[0]["type"] == "checkpoint"
    assert sink.flushes >= 1
    w.close()
    assert sink.closed == 1
    assert w.stats == {
        "submitted": 101,
        "written": 101,
        "dropped_records": 0,
        "dropped_events": 0,
        "sink_errors": {"ListSink": 0}, "thinned_records": {},
    }
    # nothing dropped -> no dropped_records event
    assert [e["type"] for e in sink.events] == ["checkpoint"]


def test_full_queue_never_blocks_submit_and_drops_are_reported() -> None:
    slow = GatedSink()
    w = AsyncWriter([slow], maxsize=4)
    assert w.submit_steps([rec(0)])
    assert slow.entered.wait(10)  # the writer thread is now stuck inside the slow sink
    results = [w.submit_steps([rec(i)]) for i in range(1, 1001)]
    results.append(w.submit_event(schema.make_event("eval", 1000, 0.0)))
    # Every submit has returned while the sink is still blocked (it has written nothing):
    assert not slow.release.is_set() and slow.steps == []
    stats = w.stats
    assert results[:4] == [True] * 4  # the queue's 4 free slots, then everything drops
    assert results.count(True) == 4
    assert stats["dropped_records"] == 1000 - 4 and stats["dropped_events"] == 1
    slow.release.set()
    assert w.flush(timeout=10)
    w.close()
    stats = w.stats
    assert stats["submitted"] == 1002
    assert stats["dropped_records"] > 0
    assert stats["submitted"] == stats["written"] + stats["dropped_records"] + stats["dropped_events"]
    assert len(slow.steps) == stats["written"] == 5
    dropped = [e for e in slow.events if e["type"] == "dropped_records"]
    assert len(dropped) == 1
    assert dropped[0]["data"]["dropped_records"] == 996
    assert dropped[0]["data"]["dropped_events"] == 1
    assert dropped[0]["step"] == 4  # last step actually written


def test_raising_sink_does_not_stop_the_others(capsys) -> None:
    good = ListSink()
    w = AsyncWriter([RaisingSink(), good])
    for i in range(20):
        w.submit_steps([rec(i)])
        w.submit_event(schema.make_event("warning", i, 0.0))
        w.flush()  # force one write_steps call per record
    w.close()
    assert [r["step"] for r in good.steps] == list(range(20))
    assert len(good.events) == 20 and good.closed == 1
    assert w.stats["sink_errors"] == {"boom": 40, "ListSink": 0}
    err = capsys.readouterr().err
    assert err.count("sink boom failed") == 1  # one warning, not one per record
    assert "OSError: disk on fire" in err


def test_close_is_idempotent_and_submit_after_close_is_counted() -> None:
    sink = ListSink()
    w = AsyncWriter([sink])
    w.submit_steps([rec(0)])
    w.close()
    w.close()
    assert sink.closed == 1
    assert w.submit_steps([rec(1), rec(2)]) is False
    assert w.submit_event(schema.make_event("eval", 2, 0.0)) is False
    assert w.stats["dropped_records"] == 2 and w.stats["dropped_events"] == 1
    assert w.flush() is False


def test_empty_batch_is_a_no_op() -> None:
    w = AsyncWriter([])
    assert w.submit_steps([]) is True
    w.close()
    assert w.stats["submitted"] == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_maxsize_is_a_config_error(bad) -> None:
    with pytest.raises(ConfigError, match="maxsize"):
        AsyncWriter([], maxsize=bad)


def test_duplicate_sink_names_are_counted_separately() -> None:
    w = AsyncWriter([RaisingSink(), RaisingSink()])
    w.submit_steps([rec(0)])
    w.close()
    assert w.stats["sink_errors"] == {"boom": 1, "boom#2": 1}


def test_interpreter_exit_writes_queued_records(tmp_path: Path) -> None:
    # No close(), no flush(): the atexit hook must drain the queue before the process ends.
    code = f"""
import sys
from trainspeed.sinks import AsyncWriter, JsonlSink
w = AsyncWriter([JsonlSink({str(tmp_path)!r})])
for i in range(500):
    w.submit_steps([{{"schema": 1, "step": i}}])
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    lines = (tmp_path / schema.STEPS_FILE).read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(500))


def test_writer_with_jsonl_sink_roundtrip(tmp_path: Path) -> None:
    w = AsyncWriter([JsonlSink(tmp_path)])
    w.submit_steps([rec(i) for i in range(10)])
    w.close()
    steps = [json.loads(x) for x in (tmp_path / schema.STEPS_FILE).read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(10))


def test_close_from_inside_a_sink_does_not_deadlock() -> None:
    class ClosingSink(ListSink):
        writer: AsyncWriter

        def write_steps(self, records):
            super().write_steps(records)
            self.writer.close()

    sink = ClosingSink()
    w = AsyncWriter([sink])
    sink.writer = w
    w.submit_steps([rec(0)])
    w._thread.join(10)
    assert not w._thread.is_alive() and sink.closed == 1 and w.closed


def test_thinning_stride_doubles_with_the_backlog():
    from trainspeed.sinks.writer import thinning_stride

    assert [thinning_stride(b, 1024) for b in (0, 63, 64, 127, 128, 256, 512, 1024)] == [1, 1, 2, 2, 4, 8, 16, 32]
    assert thinning_stride(10**6, 1024) == 64  # capped
    assert thinning_stride(0, 1) == 1 and thinning_stride(1, 1) == 2


def test_thin_keeps_every_kth_and_always_the_newest():
    from trainspeed.sinks.writer import thin

    records = [rec(i) for i in range(1, 11)]
    assert [r["step"] for r in thin(records, 1)] == list(range(1, 11))
    assert [r["step"] for r in thin(records, 4)] == [2, 6, 10]
    assert [r["step"] for r in thin(records[:1], 8)] == [1]


class StalledDashboard(ListSink):
    """A dashboard whose first write stalls (a slow network, a TensorBoard flush) until the
    test opens the gate, so a backlog builds up deterministically."""

    name = "dashboard"
    thinnable = True

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def write_steps(self, records):
        assert self.gate.wait(30)
        super().write_steps(records)


def test_a_slow_dashboard_is_thinned_and_the_complete_record_keeps_everything():
    complete, dashboard = ListSink(), StalledDashboard()
    writer = AsyncWriter([complete, dashboard], maxsize=256)
    batches, per_batch = 200, 50
    for b in range(batches):
        writer.submit_steps([rec(b * per_batch + i + 1) for i in range(per_batch)])
    dashboard.gate.set()  # ~200 batches are waiting behind the stalled write
    writer.close()
    stats = writer.stats
    total = batches * per_batch
    assert stats["dropped_records"] == 0
    assert [r["step"] for r in complete.steps] == list(range(1, total + 1))
    got = [r["step"] for r in dashboard.steps]
    assert 0 < len(got) < total / 4 and got == sorted(got) and got[-1] == total
    assert stats["thinned_records"] == {"dashboard": total - len(got)}
    events = [e for e in complete.events if e["type"] == "thinned_records"]
    assert len(events) == 1 and events[0]["data"]["sinks"] == {"dashboard": total - len(got)}


def test_built_records_are_made_on_the_writer_thread_in_order_and_never_lost_to_a_full_queue(capsys) -> None:
    """The Monitor hands a log interval's marks to the writer, which resolves them into records
    (submit_built): in order with the other items, on the writer thread; with the queue full the
    build runs on the caller's thread (what it keeps in order stays right) and its records are
    dropped and counted; a build that raises drops its records, says so once, and the writer goes on."""
    sink = ListSink()
    w = AsyncWriter([sink])
    built_on: list[str] = []

    def build(first: int, n: int):
        def make():
            built_on.append(threading.current_thread().name)
            return [rec(first + i) for i in range(n)]
        return make

    assert w.submit_steps([rec(0)])
    assert w.submit_built(2, build(1, 2))
    assert w.submit_event(schema.make_event("eval", 2, 0.0))
    assert w.submit_built(0, build(99, 0))  # nothing to build: not queued, not counted
    assert w.flush(timeout=10)
    assert [r["step"] for r in sink.steps] == [0, 1, 2] and [e["type"] for e in sink.events] == ["eval"]
    assert built_on == ["trainspeed-writer"]

    def broken():
        raise ValueError("no marks")

    assert w.submit_built(3, broken)
    assert w.submit_built(1, build(3, 1))
    assert w.flush(timeout=10)
    assert [r["step"] for r in sink.steps] == [0, 1, 2, 3]
    assert "3 step records could not be built: ValueError: no marks" in capsys.readouterr().err
    w.close()
    stats = w.stats
    assert stats["dropped_records"] == 3
    assert stats["submitted"] == stats["written"] + stats["dropped_records"] + stats["dropped_events"]

    slow = GatedSink()
    w = AsyncWriter([slow], maxsize=2)
    assert w.submit_steps([rec(0)])
    assert slow.entered.wait(10)
    built_on.clear()
    results = [w.submit_built(1, build(i, 1)) for i in range(1, 5)]
    assert results == [True, True, False, False]
    assert built_on == ["MainThread", "MainThread"]  # the queue was full: built here, dropped
    slow.release.set()
    w.close()
    assert [r["step"] for r in slow.steps] == [0, 1, 2] and w.stats["dropped_records"] == 2
