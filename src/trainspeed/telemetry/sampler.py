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

__all__ = ["GpuReader", "NvmlReader", "open_nvml", "SystemSampler", "HOST_FIELDS", "GPU_FIELDS",
           "RUN_ROOT_PID_ENV", "SERIES_FIELDS", "others_cpu_percent"]

RUN_ROOT_PID_ENV = "TRAINSPEED_RUN_ROOT_PID"
"""Set to a process's pid, that process's whole tree is the run: cpu_tree counts it, and
cpu_others what lies outside it. A training process a script started itself (the doctor
follows it: doctor/spawned.py) would otherwise read its sibling trainers as other processes'
load, and its own slowdown as contention."""

HOST_FIELDS: tuple[str, ...] = ("t", "cpu_process", "cpu_system", "rss", "children_rss", "cpu_tree", "cpu_others")
"""cpu_process: this process, % of one core (> 100 when multi-threaded); cpu_system: the whole
machine, % of all cores; cpu_tree: this process and its children (DataLoader workers, anything it
spawned), % of one core; cpu_others: every other process on the machine (and time the hypervisor
stole), % of one core: the contention evidence (a step that got slower while others used the
cores is not the script's fault). cpu_tree/cpu_others are NaN on the first row (no interval yet)."""
SERIES_FIELDS: tuple[str, ...] = ("t", "cpu_tree", "cpu_others", "rss", "children_rss")
"""The columns `series()` returns for the run directory (the `system` event's `series`)."""
GPU_FIELDS: tuple[str, ...] = ("gpu_util", "gpu_mem_used", "gpu_power_w", "gpu_sm_clock_mhz")
_BYTES_FIELDS = ("rss", "children_rss", "gpu_mem_used")


def others_cpu_percent(busy_s: float, tree_s: float, wall_s: float) -> tuple[float, float]:
    """(this process tree's CPU, other processes' CPU), both in % of one core, from one
    interval's deltas: machine-wide busy core-seconds, this tree's CPU seconds, wall seconds.
    Pure. The tree's share is clipped into [0, busy] (a child reaped between two readings
    moves its time from the live children to children_user, which can jump either way)."""
    if not wall_s > 0:
        return math.nan, math.nan
    busy = max(0.0, busy_s)
    tree = min(max(0.0, tree_s), busy)
    return 100.0 * tree / wall_s, 100.0 * (busy - tree) / wall_s


def _busy_seconds(times: Any) -> float:
    """Machine-wide busy CPU seconds of psutil.cpu_times(): everything but idle and iowait.
    `steal` (the hypervisor ran another VM) counts: it is time other tenants took. Linux counts
    guest time inside user already, so guest fields are not added again."""
    total = 0.0
    for name in ("user", "nice", "system", "irq", "softirq", "steal"):
        total += float(getattr(times, name, 0.0) or 0.0)
    return total


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
        self._root = None  # RUN_ROOT_PID_ENV's process when it is not this one
        # Cumulative readings of the previous row: (perf_counter, machine busy s, tree CPU s).
        self._prev_cpu: tuple[float, float, float] | None = None
        self._kids: dict[int, Any] = {}  # pid -> psutil.Process of the live descendants

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "SystemSampler":
        if self._thread is not None:
            return self
        import psutil

        self._proc = psutil.Process(os.getpid())
        self._root = _run_root(psutil)
        # psutil's cpu_percent(None) measures since the previous call; the first call only primes it.
        self._proc.cpu_percent(None)
        psutil.cpu_percent(None)
        try:
            self._prev_cpu = self._cpu_totals(self._children())
        except Exception:
            self._prev_cpu = None
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

        if self._proc is None:
            self._proc = psutil.Process(os.getpid())
        row: dict[str, float] = {"t": time.time()}
        row["cpu_process"] = float(self._proc.cpu_percent(None))  # % of one core; > 100 when multi-threaded
        row["cpu_system"] = float(psutil.cpu_percent(None))  # % of all cores
        kids = self._children()
        row["rss"] = float(self._proc.memory_info().rss)
        if self._root is not None:  # the tree is the run root's: this process's own children only
            own = set(_child_pids(self._proc.pid) or ())
            row["children_rss"] = float(sum(_child_value(k, "rss") for k in kids if k.pid in own))
        else:
            row["children_rss"] = float(sum(_child_value(k, "rss") for k in kids))
        totals = self._cpu_totals(kids)
        if self._prev_cpu is not None:
            t0, busy0, tree0 = self._prev_cpu
            row["cpu_tree"], row["cpu_others"] = others_cpu_percent(
                totals[1] - busy0, totals[2] - tree0, totals[0] - t0)
        self._prev_cpu = totals
        if self._gpu is not None:
            try:
                row.update(self._gpu.read())
            except Exception:
                self._errors += 1
        return row

    def _children(self) -> list:
        """This process's descendants as psutil handles (kept between rows: creating one reads
        /proc). Linux lists each thread's children in /proc/PID/task/TID/children, a few small
        reads; psutil's children() reads every process's stat file on the machine (~2 ms)."""
        import psutil

        head = self._root or self._proc
        pids = _child_pids(head.pid)
        if pids is None:
            try:
                kids = head.children(recursive=True)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                kids = []
            self._kids = {k.pid: k for k in kids}
            return kids
        known = self._kids
        self._kids = {}
        for pid in pids:
            proc = known.get(pid)
            if proc is None:
                try:
                    proc = psutil.Process(pid)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            self._kids[pid] = proc
        return list(self._kids.values())

    def _cpu_totals(self, kids: list) -> tuple[float, float, float]:
        """(perf_counter now, machine busy CPU s, this tree's CPU s), cumulative."""
        import psutil

        mine = (self._root or self._proc).cpu_times()
        tree = mine.user + mine.system + mine.children_user + mine.children_system
        tree += sum(_child_value(k, "cpu") for k in kids)
        return time.perf_counter(), _busy_seconds(psutil.cpu_times()), float(tree)

    # ------------------------------------------------------------------ reading
    def series(self) -> dict[str, list[float | None]]:
        """SERIES_FIELDS over the rows in the ring, oldest first, as JSON-ready lists (None for
        a missing value): the run directory keeps them, so contention can be told from a slower
        script afterwards. Bounded by the ring's capacity."""
        data = self._ordered()
        # GPU utilization goes with them when a GPU is read: the doctor's GPU busy figure is
        # its mean over the rows inside the measured steps only (telemetry/gpu_busy.py).
        names = SERIES_FIELDS + (("gpu_util",) if np.isfinite(data["gpu_util"]).any() else ())
        return {name: [float(v) if math.isfinite(v) else None for v in data[name].tolist()]
                for name in names}

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


def _run_root(psutil: Any) -> Any:
    """The RUN_ROOT_PID_ENV process when set, alive and not this one, else None."""
    value = os.environ.get(RUN_ROOT_PID_ENV, "")
    if not value.isdigit() or int(value) == os.getpid():
        return None
    try:
        return psutil.Process(int(value))
    except Exception:  # gone, or not ours to read
        return None


def _child_value(proc: Any, what: str) -> float:
    """A child's RSS (bytes) or CPU seconds (user + system); 0 for one that just exited."""
    try:
        if what == "rss":
            return float(proc.memory_info().rss)
        times = proc.cpu_times()
        return float(times.user + times.system)
    except Exception:  # NoSuchProcess, ZombieProcess, AccessDenied: the worker is gone
        return 0.0


def _child_pids(pid: int) -> list[int] | None:
    """Descendants of `pid` from /proc/PID/task/TID/children (Linux), or None where that file
    does not exist (another OS, a kernel without CONFIG_PROC_CHILDREN): use psutil then."""
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        return None
    out: list[int] = []
    stack = [pid]
    while stack and len(out) < 4096:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:  # exited meanwhile
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    found = [int(p) for p in f.read().split()]
            except (OSError, ValueError):
                continue
            out.extend(found)
            stack.extend(found)
    return out
