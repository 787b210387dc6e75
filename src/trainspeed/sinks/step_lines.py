"""Step records -> JSON lines, fast: the writer's largest cost per step.

`json.dumps` spends ~13 µs on one step record on the 2-core CI machine, most of it in
`float.__repr__` (the shortest round-trip digits, ~0.6 µs a float, a dozen floats a record),
and the writer thread's work holds the GIL the training loop needs. A record of the Monitor's
own shape (telemetry/records.py) is written here from one %-format template instead: times
with a fixed number of digits (C formatting, ~0.25 µs), the loss and lr exactly as repr()
writes them. The line parses to the same record, up to the digits noted on each field.

Any record of another shape (a key added, removed or reordered, a value of an unexpected
type) or with a value JSON cannot hold (NaN, inf) goes through schema.dumps, as every record
did before, so this is an optimisation, never a second format.
"""

from __future__ import annotations

from typing import Any

from trainspeed.telemetry import schema
from trainspeed.telemetry.schema import PHASES

__all__ = ["STEP_KEYS", "step_line", "step_lines"]

# The key order step_records writes; a record with any other keys takes the general path.
STEP_KEYS: tuple[str, ...] = ("schema", "step", "t_wall", "t_step", "cpu", "phases", "samples", "tokens",
                              "pad_share", "loss", "lr", "mem", "syncs", "warmup", "rank")

# Seconds: t_wall to the microsecond (an epoch time has 10 digits before the point), step and
# phase times to 9 significant digits (a nanosecond in a second-long step).
_PHASES = ",".join(f'"{name}":%.9g' for name in PHASES)
_HEAD = '{"schema":%d,"step":%d,"t_wall":%.6f,"t_step":%.9g,"cpu":%s,"phases":{' + _PHASES + "}"
_TAIL = ',"samples":%d,"tokens":%d,"pad_share":%s,"loss":%s,"lr":%s,"mem":'
_END = ',"syncs":%d,"warmup":%s,"rank":%d}\n'
_INT_KEYS = ("schema", "step", "samples", "tokens", "syncs", "rank")


def _opt(x: Any) -> str:
    """An optional number as JSON: null, or the shortest repr of the float (exact)."""
    if x is None:
        return "null"
    if x.__class__ is float:
        return x.__repr__()  # 'nan'/'inf' are caught by the caller's check
    raise TypeError(x)


def _opt_short(x: Any) -> str:
    """An optional time or share: null, or 9 significant digits."""
    if x is None:
        return "null"
    if x.__class__ is float:
        return "%.9g" % x
    raise TypeError(x)


def step_line(record: dict[str, Any], mem_json: str) -> str | None:
    """One step record of the Monitor's shape as a JSON line, or None where it has another
    shape or a value JSON cannot hold (the caller then uses schema.dumps)."""
    phases = record["phases"]
    if tuple(phases) != PHASES or record["warmup"].__class__ is not bool:
        return None
    for key in _INT_KEYS:  # %d would write 3 for 3.7 where json writes 3.7
        if record[key].__class__ is not int:
            return None
    try:
        head = _HEAD % (record["schema"], record["step"], record["t_wall"], record["t_step"],
                        _opt_short(record["cpu"]), *phases.values())
        tail = _TAIL % (record["samples"], record["tokens"], _opt_short(record["pad_share"]),
                        _opt(record["loss"]), _opt(record["lr"]))
        end = _END % (record["syncs"], "true" if record["warmup"] else "false", record["rank"])
    except (TypeError, ValueError):
        return None
    if "nan" in head or "inf" in head or "nan" in tail or "inf" in tail:  # no key holds either
        return None
    return head + tail + mem_json + end


def step_lines(records: list[dict[str, Any]]) -> str:
    """Newline-terminated JSON lines of `records`; one flush's records share one `mem` dict,
    encoded once."""
    out = []
    mem_id, mem_json = None, ""
    for record in records:
        line = None
        if tuple(record) == STEP_KEYS:
            mem = record["mem"]
            if id(mem) != mem_id:
                mem_id, mem_json = id(mem), schema.dumps(mem)
            line = step_line(record, mem_json)
        out.append(line if line is not None else schema.dumps(record) + "\n")
    return "".join(out)
