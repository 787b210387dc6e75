"""A measured peak FLOP/s, kept per machine: MFU's yardstick must not move between runs.

A timed matmul on a CPU varies run to run (193-221 GFLOP/s on one machine, 15 %), so MFU
re-measured every run moves because the yardstick moved. The first measurement on a machine is
kept in `<cache dir>/peaks.json` and reused by every later run with the same key:

    device, CPU model (or GPU name), usable cores, torch threads, torch (and CUDA) version, dtype

A change to any of them (a new torch, another thread count, a container with fewer cores) is a
different yardstick and is measured anew. env.json and the `peak_flops` event say where a peak
came from: `"cached": true` and `"measured_at"` (Unix time of the measurement).

A figure timed while other processes held the cores (the matmul's threads got fewer cores than
they need: peaks.timed_quietly) is low, and kept, it would make every later MFU too high (86
GFLOP/s cached beside a test suite on 2 cores, 194-214 alone: nanoGPT read MFU 129 %). Such an
entry is marked `"quiet": false` and each later run times the matmul again and keeps the higher
figure, until one timing is quiet; entries written before this rule have no mark and are
treated the same way.

Cache dir: `$XDG_CACHE_HOME/trainspeed`, else `~/.cache/trainspeed`. To measure again (after a
BIOS change): set `TRAINSPEED_REMEASURE_PEAK=1` for one run (or `trainspeed env --measure-peak`);
the new figure replaces the cached one.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

REMEASURE_ENV = "TRAINSPEED_REMEASURE_PEAK"
"""Set to 1 to measure the peak again and replace the cached figure."""
CACHE_FILE = "peaks.json"
SCHEMA = 1


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/trainspeed`, else `~/.cache/trainspeed`."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "trainspeed"


def remeasure_requested() -> bool:
    return os.environ.get(REMEASURE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def machine_key(device: str, dtype: str) -> dict[str, Any]:
    """What the measured figure depends on (see the module docstring)."""
    import torch

    from trainspeed.telemetry.cpu_facts import cpu_model
    from trainspeed.telemetry.loader_facts import available_cores

    dev = torch.device(device)
    key: dict[str, Any] = {"device": dev.type, "dtype": dtype, "torch": torch.__version__}
    if dev.type == "cuda":
        key.update(name=torch.cuda.get_device_name(dev), cuda=torch.version.cuda)
    else:
        key.update(name=cpu_model(), cores=available_cores(), threads=torch.get_num_threads())
    return key


def _key_text(key: dict[str, Any]) -> str:
    return json.dumps(key, sort_keys=True)


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # absent or unreadable: measure (the file is rewritten whole below)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("peaks"), dict):
        return {}
    return data["peaks"]


def _store(path: Path, peaks: dict[str, Any]) -> None:
    from trainspeed.fileio import atomic_write_text

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"schema": SCHEMA, "peaks": peaks}, indent=2) + "\n")
    except OSError:
        pass  # a read-only home: the run still has its peak, the next one measures again


def cached_measurement(key: dict[str, Any],
                       measure: Callable[[], tuple[float, bool]]) -> tuple[float, bool, float, bool]:
    """(FLOP/s, cached, measured_at, quiet): the cached figure for `key` when it was timed on a
    quiet machine, else `measure()` -> (FLOP/s, quiet), stored. An entry timed on a busy machine
    keeps the higher of its figure and the new one (a peak is a maximum). With
    `TRAINSPEED_REMEASURE_PEAK=1` the new figure replaces the cached one whatever it is."""
    path = cache_dir() / CACHE_FILE
    text = _key_text(key)
    remeasure = remeasure_requested()
    entry = _load(path).get(text)
    if not (isinstance(entry, dict) and isinstance(entry.get("flops"), (int, float)) and entry["flops"] > 0):
        entry = None
    if entry is not None and not remeasure and entry.get("quiet") is True:
        return float(entry["flops"]), True, float(entry.get("measured_at") or 0.0), True
    flops, quiet = measure()
    flops, cached, when = float(flops), False, time.time()
    if entry is not None and not remeasure and float(entry["flops"]) > flops:
        flops, cached, when = float(entry["flops"]), True, float(entry.get("measured_at") or 0.0)
    peaks = _load(path)  # re-read: another process may have stored a key meanwhile
    peaks[text] = {"key": key, "flops": flops, "measured_at": when, "quiet": bool(quiet)}
    _store(path, peaks)
    return flops, cached, when, bool(quiet)


__all__ = ["CACHE_FILE", "REMEASURE_ENV", "cache_dir", "cached_measurement", "machine_key", "remeasure_requested"]
