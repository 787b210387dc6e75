"""Background system sampler: CPU utilization, RSS (main + workers), and GPU state via NVML.

A daemon thread wakes every `interval_s` and writes one row into fixed-size numpy rings, so
memory does not grow with run length. It never touches CUDA (NVML reads the driver's counters
without synchronizing any stream). GPU fields come from `pynvml` (package nvidia-ml-py) when it
is installed and a GPU is present; otherwise they are simply absent.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any, Protocol

import numpy as np

from trainspeed.errors import ConfigError

__all__ = ["GpuReader", "NvmlReader", "open_nvml", "SystemSampler", "HOST_FIELDS", "GPU_FIELDS"]

HOST_FIELDS: tuple[str, ...] = ("t", "cpu_process", "cpu_system", "rss", "children_rss")
GPU_FIELDS: tuple[str, ...] = ("gpu_util", "gpu_mem_used", "gpu_power_w", "gpu_sm_clock_mhz")
_BYTES_FIELDS = ("rss", "children_rss", "gpu_mem_used")


class GpuReader(Protocol):
    """One GPU's live counters. `read()` returns any subset of GPU_FIELDS (missing = unsupported)."""

    def read(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class NvmlReader:
    """GpuReader over NVML (pynvml). Each counter is read separately: a GPU that does not
    report power (some vGPUs / MIG slices) still reports utilization."""

    def __init__(self, pynvml: Any, handle: Any):
        self._nvml = pynvml
        self._handle = handle

    def read(self) -> dict[str, float]:
        nv, h = self._nvml, self._handle
        out: dict[str, float] = {}
        readers = {
            "gpu_util": lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu),
            "gpu_mem_used": lambda: float(nv.nvmlDeviceGetMemoryInfo(h).used),
            "gpu_power_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,  # NVML reports milliwatts
            "gpu_sm_clock_mhz": lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        }
        for name, fn in readers.items():
            try:
                out[name] = fn()
            except Exception:  # NVMLError_NotSupported and friends: leave the field out
                continue
        return out

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


def _nvml_index(cuda_index: int) -> tuple[str | None, int]:
    """(GPU UUID if torch knows it, NVML index guess). NVML numbers GPUs by PCI order while CUDA
    honours CUDA_VISIBLE_DEVICES, so the UUID is the reliable key."""
    uuid = None
    try:
        import torch

        if torch.cuda.is_available():
            uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
    except Exception:
        uuid = None
    index = cuda_index
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if parts and cuda_index < len(parts) and parts[cuda_index].isdigit():
        index = int(parts[cuda_index])
    return uuid, index


def open_nvml(cuda_index: int) -> GpuReader | None:
    """An NvmlReader for CUDA device `cuda_index`, or None when pynvml/NVML/the GPU is unavailable."""
    try:
        import pynvml  # lazy: optional extra trainspeed[nvml] (package nvidia-ml-py)
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    uuid, index = _nvml_index(cuda_index)
    handle = None
    if uuid:
        for key in (uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}", uuid):
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(key)
                break
            except Exception:
                continue
    if handle is None:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass
            return None
    return NvmlReader(pynvml, handle)


class SystemSampler:
    """Samples host (and GPU) utilization on a daemon thread into fixed-size rings.

    sampler = SystemSampler(interval_s=1.0); sampler.start(); ...; sampler.stop()
    latest() is the newest row, samples() the rows in time order, summary() means and maxima.
    """

    def __init__(
        self,
        interval_s: float = 1.0,
        capacity: int = 3600,
        gpu_index: int | None = None,
        *,
        gpu_reader: GpuReader | None = None,
    ):
        if not (isinstance(interval_s, (int, float)) and interval_s > 0 and math.isfinite(interval_s)):
            raise ConfigError(f"SystemSampler interval_s must be > 0 seconds, got {interval_s!r}")
        if not (isinstance(capacity, int) and capacity >= 1):
            raise ConfigError(f"SystemSampler capacity must be an int >= 1, got {capacity!r}")
        self.interval_s = float(interval_s)
        self.capacity = capacity
        self.gpu_index = gpu_index
        self._gpu = gpu_reader
        self._open_gpu = gpu_reader is None and gpu_index is not None
        self._fields = HOST_FIELDS + GPU_FIELDS
        self._ring = {name: np.full(capacity, np.nan) for name in self._fields}
        self._count = 0  # rows written in total; the ring holds the last min(count, capacity)
        self._errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "SystemSampler":
        if self._thread is not None:
            return self
        import psutil

        self._proc = psutil.Process(os.getpid())
        # psutil's cpu_percent(None) measures since the previous call; the first call only primes it.
        self._proc.cpu_percent(None)
        psutil.cpu_percent(None)
        if self._open_gpu:
            self._gpu = open_nvml(self.gpu_index)  # in the caller's thread: NVML init is not instant
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="trainspeed-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread promptly (it waits on an Event, not in sleep) and release NVML."""
        self._stop.set()
        if self._thread is not None:
            # The loop waits on the Event, so it exits within one read; a read is milliseconds
            # (NVML, /proc), so 5 s is only a guard against a hung driver call.
            self._thread.join(timeout=5.0)
            self._thread = None
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None

    def __enter__(self) -> "SystemSampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def has_gpu(self) -> bool:
        return self._gpu is not None

    # ------------------------------------------------------------------ sampling
    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_once()

    def sample_once(self) -> None:
        """Take one row now (the thread calls this; tests may too). Never raises."""
        try:
            row = self._read()
        except Exception:
            self._errors += 1
            return
        with self._lock:
            i = self._count % self.capacity
            for name in self._fields:
                self._ring[name][i] = row.get(name, np.nan)
            self._count += 1

    def _read(self) -> dict[str, float]:
        import psutil

        from trainspeed.telemetry.memory import process_rss

        if self._proc is None:
            self._proc = psutil.Process(os.getpid())
        row: dict[str, float] = {"t": time.time()}
        row["cpu_process"] = float(self._proc.cpu_percent(None))  # % of one core; > 100 when multi-threaded
        row["cpu_system"] = float(psutil.cpu_percent(None))  # % of all cores
        rss, children = process_rss(include_children=True)
        row["rss"], row["children_rss"] = float(rss), float(children)
        if self._gpu is not None:
            try:
                row.update(self._gpu.read())
            except Exception:
                self._errors += 1
        return row

    # ------------------------------------------------------------------ reading
    def _ordered(self) -> dict[str, np.ndarray]:
        with self._lock:
            n = min(self._count, self.capacity)
            start = self._count % self.capacity if self._count > self.capacity else 0
            idx = (np.arange(n) + start) % self.capacity
            return {name: arr[idx].copy() for name, arr in self._ring.items()}

    def samples(self) -> dict[str, np.ndarray]:
        """Rows in time order (oldest first); GPU columns only when a GPU reader is present."""
        data = self._ordered()
        return {k: v for k, v in data.items() if k in HOST_FIELDS or np.isfinite(v).any()}

    def latest(self) -> dict[str, float | int]:
        """The newest row (finite values only; bytes as int), or {} before the first sample."""
        with self._lock:
            if self._count == 0:
                return {}
            i = (self._count - 1) % self.capacity
            row = {name: float(arr[i]) for name, arr in self._ring.items()}
        return {k: (int(v) if k in _BYTES_FIELDS else v) for k, v in row.items() if math.isfinite(v)}

    def summary(self) -> dict[str, float | int]:
        """{"samples", "interval_s", "<field>_mean", "<field>_max", ...} over the rows in the ring."""
        data = self._ordered()
        out: dict[str, float | int] = {"samples": int(data["t"].size), "interval_s": self.interval_s}
        if self._errors:
            out["sample_errors"] = self._errors
        for name in self._fields:
            if name == "t":
                continue
            values = data[name][np.isfinite(data[name])]
            if values.size == 0:
                continue
            mean, peak = float(values.mean()), float(values.max())
            if name in _BYTES_FIELDS:
                out[f"{name}_mean"], out[f"{name}_max"] = int(mean), int(peak)
            else:
                out[f"{name}_mean"], out[f"{name}_max"] = mean, peak
        return out
