"""Where step records and events go: an async writer thread feeding pluggable sinks."""

from __future__ import annotations

from trainspeed.sinks.base import NullSink, Sink
from trainspeed.sinks.csv_sink import CsvSink
from trainspeed.sinks.factory import SINK_NAMES, make_sinks
from trainspeed.sinks.jsonl import JsonlSink
from trainspeed.sinks.writer import AsyncWriter

__all__ = ["AsyncWriter", "CsvSink", "JsonlSink", "NullSink", "SINK_NAMES", "Sink", "make_sinks"]
