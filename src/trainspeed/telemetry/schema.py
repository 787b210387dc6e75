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

  {"schema": 1, "step": 12, "t_wall": 1732240000.12, "t_step": 0.0123, "cpu": 0.0119,
   "phases": {"data": .., "h2d": .., "forward": .., "backward": .., "optimizer": ..,
              "log": .., "ckpt": .., "eval": .., "other": ..},
   "samples": 32, "tokens": 4096, "pad_share": 0.12, "loss": 2.31, "lr": 0.001,
   "mem": {"cuda_alloc_peak": .., "cuda_reserved_peak": .., "cuda_alloc_retries": .., "rss": ..},
   "syncs": 0, "warmup": false, "rank": 0}

  `phases` always holds every name in PHASES; "other" is t_step minus the sum of the rest
  (never negative). `warmup` marks steps excluded from throughput (warm-up, compilation).
  `cpu` (added in schema 1, absent in older records) is the CPU seconds the training process
  (all its threads) used in the step: a wall time that grows while `cpu` does not is the
  machine's load, not the script (see telemetry/contention.py). Steps shorter than 20 ms share
  one reading of the CPU clock, split evenly (Monitor.CPU_READ_EVERY_S). The `system` event
  carries the sampler's `series` (t, cpu_tree, cpu_others, rss, children_rss; % of one core,
  bytes).

An event record:

  {"schema": 1, "type": "checkpoint", "step": 100, "t_wall": ..., "data": {...}}
"""

from __future__ import annotations

import json
import math
import re
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
    "interrupt",  # Ctrl-C or a signal ended the run: data.signal, data.exit_code (not a crash)
    "requeue",  # SLURM's SIGUSR1 save, then `scontrol requeue`: data.job, data.error (null: requeued)
    "dropped_records",
    "thinned_records",  # dashboards (TensorBoard, W&B) sent fewer records to keep up
    "profile",  # a torch.profiler trace of a step window: data.path (in the run dir), data.captured
    "epoch",  # an epoch's first batch is next: data.epoch, data.steps_per_epoch (null: unknown)
    "update_losses",  # several optimizers (a GAN's D and G): each one's loss per step (telemetry/update_losses.py)
)


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
"""A terminal escape sequence (CSI, or a two-character one)."""


def plain_text(text: str) -> str:
    """`text` without terminal escape sequences: torch's own messages embed bold on/off
    (torch.load's weights_only error), which a report, a file or a log shows as `[1m`."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def traceback_text(error: BaseException) -> str:
    """The error's traceback as Python prints it, without terminal escapes."""
    import traceback

    return plain_text("".join(traceback.format_exception(type(error), error, error.__traceback__)))


def error_line(error: BaseException) -> str:
    """`Type: the message's first line`, as a finding or a summary shows what a script raised
    (a multi-line message's later lines are in the traceback)."""
    return f"{type(error).__name__}: {(plain_text(str(error)).strip().splitlines() or [''])[0]}"


def ending_event(error: BaseException) -> tuple[str, dict[str, Any]]:
    """The event a run that ended on `error` records: ("interrupt", {signal, exit_code}) for
    Ctrl-C or a SystemExit of 128 + a signal (the engine's signal save leaves with those), else
    ("crash", {error, traceback})."""
    import signal

    name = "SIGINT" if isinstance(error, KeyboardInterrupt) else None
    code = 130 if name else getattr(error, "code", None)
    if name is None and isinstance(error, SystemExit) and isinstance(code, int) and not isinstance(code, bool):
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = None
    if name is not None:
        return "interrupt", {"signal": name, "exit_code": code}
    return "crash", {"error": plain_text(f"{type(error).__name__}: {error}"), "traceback": traceback_text(error)}


def check_schema(record: dict[str, Any], *, where: str) -> None:
    """Reject records from a newer major schema with a message that says what to do."""
    version = record.get("schema", SCHEMA_VERSION)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise SchemaError(
            f"{where} has schema {version!r}, but this trainspeed reads schema <= {SCHEMA_VERSION}. "
            "Upgrade trainspeed (pip install -U trainspeed) to read it."
        )


def dumps(record: dict[str, Any]) -> str:
    """One JSON line. NaN/Inf become null so every line is valid JSON for any reader.
    Fast path first: records are almost always clean, and sanitizing costs a full copy."""
    try:
        return json.dumps(record, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError):
        return json.dumps(sanitize_any(record), separators=(",", ":"), allow_nan=False)


def sanitize_any(value: Any) -> Any:
    """Make a value JSON/YAML-safe: non-finite floats -> None, numpy scalars -> Python,
    tuples -> lists, Paths and other objects -> str (recursively)."""
    if isinstance(value, dict):
        return {str(k): sanitize_any(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize_any(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return sanitize_any(item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def sanitize(record: dict[str, Any]) -> dict[str, Any]:
    """Alias of sanitize_any for one record."""
    return sanitize_any(record)


def make_event(type_: str, step: int | None, t_wall: float, **data: Any) -> dict[str, Any]:
    return {"schema": SCHEMA_VERSION, "type": type_, "step": step, "t_wall": t_wall, "data": data}
