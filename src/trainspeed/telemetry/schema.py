"""The run directory's record format (schema 1): the one data format of trainspeed.

Every writer (Monitor, engine, doctor, tuner) and every reader (report, checks, tune) goes
through the names defined here, so a field is spelled in exactly one place.

runs/<name>/
  config.yaml    resolved config (engine) or {"command": [...]} (doctor)
  env.json       {"schema": 1, "python", "torch", "cuda", "devices", "cpu", "peak_flops", ...}
  steps.jsonl    one StepRecord per line
  events.jsonl   one EventRecord per line
  report.json    {"schema": 1, "summary": {...}, "findings": [...]}
  report.html    rendered report (optional)
  tb/            TensorBoard event files (optional)

A step record (all times in seconds, memory in bytes; absent values are null):

  {"schema": 1, "step": 12, "t_wall": 1732240000.12, "t_step": 0.0123,
   "phases": {"data": .., "h2d": .., "forward": .., "backward": .., "optimizer": ..,
              "log": .., "ckpt": .., "eval": .., "other": ..},
   "samples": 32, "tokens": 4096, "pad_share": 0.12, "loss": 2.31, "lr": 0.001,
   "mem": {"cuda_alloc_peak": .., "cuda_reserved_peak": .., "cuda_alloc_retries": .., "rss": ..},
   "syncs": 0, "warmup": false, "rank": 0}

  `phases` always holds every name in PHASES; "other" is t_step minus the sum of the rest
  (never negative). `warmup` marks steps excluded from throughput (warm-up, compilation).

An event record:

  {"schema": 1, "type": "checkpoint", "step": 100, "t_wall": ..., "data": {...}}
"""

from __future__ import annotations

import json
import math
from typing import Any

from trainspeed.errors import SchemaError

SCHEMA_VERSION = 1

# The phases of a training step, in the order they usually happen. "other" is the remainder.
PHASES: tuple[str, ...] = (
    "data",
    "h2d",
    "forward",
    "backward",
    "optimizer",
    "log",
    "ckpt",
    "eval",
    "other",
)
MEASURED_PHASES: tuple[str, ...] = PHASES[:-1]

STEPS_FILE = "steps.jsonl"
EVENTS_FILE = "events.jsonl"
ENV_FILE = "env.json"
CONFIG_FILE = "config.yaml"
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
TB_DIR = "tb"

# Event types the layers emit. Readers must accept types they do not know (forward compatible).
EVENT_TYPES: tuple[str, ...] = (
    "run_start",
    "run_end",
    "compile",
    "checkpoint",
    "eval",
    "anomaly",  # NaN/Inf loss, OOM, slowdown
    "warning",
    "restart",
    "crash",
    "dropped_records",
)


def check_schema(record: dict[str, Any], *, where: str) -> None:
    """Reject records from a newer major schema with a message that says what to do."""
    version = record.get("schema", SCHEMA_VERSION)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise SchemaError(
            f"{where} has schema {version!r}, but this trainspeed reads schema <= {SCHEMA_VERSION}. "
            "Upgrade trainspeed (pip install -U trainspeed) to read it."
        )


def _finite_or_none(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def dumps(record: dict[str, Any]) -> str:
    """One JSON line. NaN/Inf become null so every line is valid JSON for any reader."""
    return json.dumps(record, separators=(",", ":"), default=_finite_or_none, allow_nan=False)


def sanitize(record: dict[str, Any]) -> dict[str, Any]:
    """Replace non-finite floats (nested) by None; json.dumps(allow_nan=False) would refuse them."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out[key] = sanitize(value)
        elif isinstance(value, float) and not math.isfinite(value):
            out[key] = None
        else:
            out[key] = value
    return out


def make_event(type_: str, step: int | None, t_wall: float, **data: Any) -> dict[str, Any]:
    return {"schema": SCHEMA_VERSION, "type": type_, "step": step, "t_wall": t_wall, "data": data}
