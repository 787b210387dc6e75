"""A measured peak FLOP/s, kept per machine: MFU's yardstick must not move between runs.

A timed matmul on a CPU varies run to run (193-221 GFLOP/s on one machine, 15 %), so MFU
re-measured every run moves because the yardstick moved. The first measurement on a machine is
kept in `<cache dir>/peaks.json` and reused by every later run with the same key:

    device, CPU model (or GPU name), usable cores, torch threads, torch (and CUDA) version, dtype

A change to any of them (a new torch, another thread count, a container with fewer cores) is a
different yardstick and is measured anew. env.json and the `peak_flops` event say where a peak
came from: `"cached": true` and `"measured_at"` (Unix time of the measurement).

Cache dir: `$XDG_CACHE_HOME/trainspeed`, else `~/.cache/trainspeed`. To measure again (after a BIOS change, on a machine that was busy
during the first measurement): set `TRAINSPEED_REMEASURE_PEAK=1` for one run (or `trainspeed env
--measure-peak`); the new figure replaces the cached one.
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

    from trainspeed.telemetry.env import cpu_model
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


def cached_measurement(key: dict[str, Any], measure: Callable[[], float]) -> tuple[float, bool, float]:
    """(FLOP/s, cached, measured_at): the cached figure for `key`, else `measure()` stored.
    `TRAINSPEED_REMEASURE_PEAK=1` measures even when a figure is cached, and replaces it."""
    path = cache_dir() / CACHE_FILE
    text = _key_text(key)
    if not remeasure_requested():
        entry = _load(path).get(text)
        if isinstance(entry, dict) and isinstance(entry.get("flops"), (int, float)) and entry["flops"] > 0:
            return float(entry["flops"]), True, float(entry.get("measured_at") or 0.0)
    flops, when = float(measure()), time.time()
    peaks = _load(path)  # re-read: another process may have stored a key meanwhile
    peaks[text] = {"key": key, "flops": flops, "measured_at": when}
    _store(path, peaks)
    return flops, False, when


__all__ = ["CACHE_FILE", "REMEASURE_ENV", "cache_dir", "cached_measurement", "machine_key", "remeasure_requested"]
