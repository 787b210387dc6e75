from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainspeed.sinks import JsonlSink
from trainspeed.sinks.jsonl import encode_lines, open_append, repair_torn_tail, write_all
from trainspeed.telemetry import schema

pytestmark = pytest.mark.timeout(120)


def test_steps_and_events_go_to_their_files(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "run")
    sink.write_steps([{"schema": 1, "step": 0, "loss": float("nan")}, {"schema": 1, "step": 1}])
    sink.write_event(schema.make_event("checkpoint", 1, 5.0, path="ck.pt", seconds=0.25))
    sink.write_steps([{"schema": 1, "step": 2, "loss": float("inf")}])
    sink.flush()
    sink.close()
    sink.close()  # idempotent
    steps = [json.loads(x) for x in (tmp_path / "run" / schema.STEPS_FILE).read_text().splitlines()]
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert steps[0]["loss"] is None and steps[2]["loss"] is None  # NaN/Inf -> null
    events = [json.loads(x) for x in (tmp_path / "run" / schema.EVENTS_FILE).read_text().splitlines()]
    assert events == [
        {"schema": 1, "type": "checkpoint", "step": 1, "t_wall": 5.0,
         "data": {"path": "ck.pt", "seconds": 0.25}}
    ]


def test_appends_to_existing_files(tmp_path: Path) -> None:
    for start in (0, 3):
        sink = JsonlSink(tmp_path)
        sink.write_steps([{"step": start + i} for i in range(3)])
        sink.close()
    lines = (tmp_path / schema.STEPS_FILE).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(6))


def test_no_events_file_until_an_event(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path)
    sink.write_steps([{"step": 0}])
    sink.close()
    assert not (tmp_path / schema.EVENTS_FILE).exists()


def test_write_all_loops_on_short_writes(monkeypatch, tmp_path: Path) -> None:
    real_write = os.write
    calls = []

    def short_write(fd, data):  # the kernel may accept fewer bytes than asked
        calls.append(len(data))
        return real_write(fd, bytes(data[:7]))

    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    blob = encode_lines([{"step": i, "pad": "x" * 10} for i in range(5)])
    monkeypatch.setattr(os, "write", short_write)
    write_all(fd, blob)
    monkeypatch.undo()
    os.close(fd)
    assert (tmp_path / "f").read_bytes() == blob
    assert len(calls) == -(-len(blob) // 7)


CHILD = r"""
import sys, time
from trainspeed.sinks import JsonlSink
from trainspeed.telemetry import schema
sink = JsonlSink(sys.argv[1])
pad = "y" * 300
step = 0
while True:
    # ~500 records (~170 KB) per batch: the process spends most of its time mid-batch.
    sink.write_steps([{"schema": 1, "step": step + i, "pad": pad, "loss": 1.0 / (1 + i)}
                      for i in range(500)])
    sink.write_event(schema.make_event("eval", step, time.time(), pad=pad))
    step += 500
    if step == 500:
        print("ready", flush=True)
"""


def _complete_lines(data: bytes) -> list[bytes]:
    """Every newline-terminated line; a torn unterminated tail (a kill mid-write) is not one."""
    return data.split(b"\n")[:-1]


def test_no_merged_line_after_repeated_sigkill(tmp_path: Path) -> None:
    """Five writers killed at random points append to the same files (a resumed run reuses its
    run directory): every complete line stays valid JSON, and a reopened sink cuts the last
    torn tail instead of gluing the next record onto it."""
    rng = random.Random(1234)
    sizes = []
    for _ in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.005, 0.15))  # kill at a random point mid-stream
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        sizes.append((tmp_path / schema.STEPS_FILE).stat().st_size)
    assert sizes == sorted(sizes) and sizes[0] > 0  # each run appended more
    JsonlSink(tmp_path).close()  # what the next run does first
    for name in (schema.STEPS_FILE, schema.EVENTS_FILE):
        data = (tmp_path / name).read_bytes()
        assert data.endswith(b"\n"), f"{name}: the reopened sink left a torn tail"
        lines = _complete_lines(data)
        assert len(lines) >= 5
        for i, line in enumerate(lines):
            record = json.loads(line)  # raises on any partial/merged line
            assert record["schema"] == 1, f"{name} line {i + 1}"


@pytest.mark.parametrize(
    ("content", "kept"),
    [
        (b"", b""),
        (b'{"a":1}\n', b'{"a":1}\n'),
        (b'{"a":1}\n{"b":', b'{"a":1}\n'),
        (b'{"b":2', b""),  # the very first record was torn
    ],
)
def test_repair_torn_tail(tmp_path: Path, content: bytes, kept: bytes) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(content)
    fd = open_append(path)
    try:
        write_all(fd, b'{"c":3}\n')
    finally:
        os.close(fd)
    assert path.read_bytes() == kept + b'{"c":3}\n'


def test_repair_scans_back_over_a_tail_longer_than_one_chunk(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"a":1}\n' + b"x" * 200)
    fd = os.open(path, os.O_RDWR)
    try:
        assert repair_torn_tail(fd, chunk=16) == 200
    finally:
        os.close(fd)
    assert path.read_bytes() == b'{"a":1}\n'
