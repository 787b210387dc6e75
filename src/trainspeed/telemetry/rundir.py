"""Write and read run directories (see schema.py for the format).

The reader is tolerant: a malformed line (a crash mid-write on another tool, a hand edit) is
skipped and reported in `RunData.skipped`, so a report can still show everything valid.
A record from a newer major schema is an error, because guessing its meaning would mislead.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from trainspeed.errors import RunDirError, SchemaError
from trainspeed.fileio import atomic_write_text
from trainspeed.telemetry import schema
from trainspeed.telemetry.jsonfile import write_json  # re-exported: rundir.write_json
from trainspeed.telemetry.ranks import rank_dirs


_TOLD: dict[str, str] = {}


def unwritable(run_dir: str | Path | None, exc: OSError) -> None:
    """Say, once per run directory and process, that it cannot be written (full, read-only,
    removed), and that training goes on without it: telemetry never stops the user's run."""
    key = str(run_dir)
    if key in _TOLD:
        return
    reason = _TOLD[key] = exc.strerror or type(exc).__name__
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != key else ""
    print(f"trainspeed: warning: cannot write the run directory {run_dir}{where}: {reason}; "
          "training goes on, its records from here on are not kept", file=sys.stderr, flush=True)


def unwritable_reason(run_dir: str | Path | None) -> str | None:
    """Why `run_dir` could not be written in this process ("No space left on device"), or
    None when every write into it went through."""
    return _TOLD.get(str(run_dir))


def try_write(run_dir: str | Path | None, write: Any, *args: Any) -> Any:
    """`write(*args)`, or None (said once, see unwritable) when the run directory cannot be
    written."""
    try:
        return write(*args)
    except OSError as exc:
        unwritable(run_dir, exc)
        return None


def last_recorded_step(run_dir: str | Path) -> int | None:
    """The step of the last complete record in steps.jsonl (its tail only is read), or None."""
    path = Path(run_dir) / schema.STEPS_FILE
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - (64 << 10)))
            tail = f.read()
    except OSError:
        return None
    for line in reversed(tail.split(b"\n")):
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue
        if isinstance(step, int):
            return step
    return None


def write_config(run_dir: str | Path, config: dict[str, Any]) -> Path:
    text = yaml.safe_dump(schema.sanitize_any(config), sort_keys=False)
    return atomic_write_text(Path(run_dir) / schema.CONFIG_FILE, text)


def write_env(run_dir: str | Path, env: dict[str, Any] | None = None) -> Path:
    if env is None:
        from trainspeed.telemetry.env import collect_env

        env = collect_env()
    return write_json(Path(run_dir) / schema.ENV_FILE, env)


def step_array(steps: list[dict[str, Any]], key: str) -> np.ndarray:
    """Float array of one (dotted) field over step records: `phases.forward` reads nested
    keys; booleans become 0/1; missing, null or non-numeric values become NaN."""
    parts = key.split(".")
    out = np.full(len(steps), np.nan, dtype=np.float64)
    for i, record in enumerate(steps):
        value: Any = record
        for part in parts:
            value = value.get(part) if isinstance(value, dict) else None
            if value is None:
                break
        if isinstance(value, (int, float)):  # bool is an int: True -> 1.0
            out[i] = float(value)
    return out


@dataclass
class RunData:
    """Everything in a run directory, as read."""

    path: Path
    env: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    report: dict[str, Any] | None = None
    skipped: list[str] = field(default_factory=list)
    rank_steps: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """Step records of ranks r > 0 of a data-parallel run (rank 0's are `steps`)."""

    @property
    def name(self) -> str:
        """The run directory's name; `trainspeed report .` names the directory, not ''."""
        return self.path.name or self.path.resolve().name

    def array(self, key: str) -> np.ndarray:
        """A float array of one field over the steps; `phases.forward` reads nested keys.
        Missing or null values become NaN."""
        return step_array(self.steps, key)

    def events_of(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == type_]

    def start_data(self) -> dict[str, Any]:
        """The first run_start event's data (device, precision, warm-up, command ...); {} without one."""
        starts = self.events_of("run_start")
        return (starts[0].get("data") or {}) if starts else {}


def _read_jsonl(path: Path, skipped: list[str], *, required: tuple[str, ...]) -> list[dict]:
    records: list[dict] = []
    if not path.exists():
        return records
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    partial_tail = bool(lines) and lines[-1] != b""
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            last = lineno == len(lines) and partial_tail
            why = "incomplete last line (the writer stopped mid-line)" if last else "not valid JSON"
            skipped.append(f"{path.name} line {lineno}: {why}")
            continue
        if not isinstance(record, dict):
            skipped.append(f"{path.name} line {lineno}: not a JSON object")
            continue
        schema.check_schema(record, where=f"{path} line {lineno}")
        missing = [k for k in required if k not in record]
        if missing:
            skipped.append(f"{path.name} line {lineno}: missing {', '.join(missing)}")
            continue
        records.append(record)
    return records


def _read_json(path: Path, skipped: list[str]) -> dict | None:
    if not path.exists():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        skipped.append(f"{path.name}: not valid JSON ({exc})")
        return None
    if not isinstance(obj, dict):
        skipped.append(f"{path.name}: not a JSON object")
        return None
    schema.check_schema(obj, where=str(path))
    return obj


def _restart_steps(events: list[dict[str, Any]]) -> list[int]:
    """The steps a resumed run restarted from (its `restart` events' checkpoint step)."""
    out = []
    for event in events:
        data = event.get("data") or {}
        at = data.get("at_step", data.get("from_step")) if event.get("type") == "restart" else None
        if isinstance(at, int) and not isinstance(at, bool):
            out.append(at)
    return out


def _last_runs(steps: list[dict[str, Any]], restarted: list[int], skipped: list[str] | None) -> list[dict[str, Any]]:
    """Step records in step order, each step once where a resume ran it again: a run killed at
    step 7 after its step-4 checkpoint recorded steps 5-7, and the resume from step 4 recorded
    them again (the run read 13 steps of 10, three of them twice). The later record, of the run
    that went on, is kept; the earlier ones are named in `skipped`. Without a restart, records
    keep every step as written (a loop may restart its own Monitor's count)."""
    if restarted and steps:
        last = {rec["step"]: i for i, rec in enumerate(steps)}
        first_rerun = min(restarted)
        rerun = {rec["step"] for i, rec in enumerate(steps) if last[rec["step"]] != i and rec["step"] > first_rerun}
        if rerun:
            steps = [rec for i, rec in enumerate(steps) if last[rec["step"]] == i or rec["step"] not in rerun]
            dropped = sorted(rerun)
            if skipped is not None:
                span = f"step {dropped[0]}" if len(dropped) == 1 else f"steps {dropped[0]}-{dropped[-1]}"
                skipped.append(f"{schema.STEPS_FILE}: {span} ran twice, before a restart from an earlier "
                               "checkpoint and after it: the records of the run that went on are kept")
    return sorted(steps, key=lambda r: r["step"])


def read_run(path: str | Path) -> RunData:
    """Read a run directory. Raises RunDirError if it is not one, SchemaError if too new."""
    run_path = Path(path)
    if not run_path.is_dir():
        raise RunDirError(f"{run_path} is not a directory. Give the path of a run directory "
                          f"(it contains {schema.STEPS_FILE}), e.g. runs/<name>.")
    known = (schema.STEPS_FILE, schema.EVENTS_FILE, schema.ENV_FILE, schema.REPORT_JSON)
    if not any((run_path / name).exists() for name in known):
        raise RunDirError(f"{run_path} is not a trainspeed run directory: none of "
                          f"{', '.join(known)} is there.")
    run = RunData(path=run_path)
    run.events = _read_jsonl(run_path / schema.EVENTS_FILE, run.skipped, required=("type",))
    restarted = _restart_steps(run.events)
    run.steps = _last_runs(_read_jsonl(run_path / schema.STEPS_FILE, run.skipped, required=("step", "t_step")),
                           restarted, run.skipped)
    for r, directory in rank_dirs(run_path).items():
        steps = _read_jsonl(directory / schema.STEPS_FILE, run.skipped, required=("step", "t_step"))
        run.rank_steps[r] = _last_runs(steps, restarted, None)
    run.env = _read_json(run_path / schema.ENV_FILE, run.skipped) or {}
    run.report = _read_json(run_path / schema.REPORT_JSON, run.skipped)
    config_path = run_path / schema.CONFIG_FILE
    if config_path.exists():
        try:
            loaded = yaml.safe_load(config_path.read_text(encoding="utf-8"))
            run.config = loaded if isinstance(loaded, dict) else {}
        except yaml.YAMLError as exc:
            run.skipped.append(f"{schema.CONFIG_FILE}: not valid YAML ({exc})")
    return run


__all__ = ["RunData", "read_run", "write_json", "write_config", "write_env", "SchemaError", "try_write",
           "unwritable"]


def fresh_run_dir(base: Path) -> Path:
    """`base`, or `base-2`, `base-3`... : the first that does not exist yet (timestamped
    default run directories of two runs started within one second must not collide)."""
    path, n = Path(base), 1
    while path.exists():
        n += 1
        path = Path(base).with_name(f"{Path(base).name}-{n}")
    return path
