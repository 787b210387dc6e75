"""Environment facts for env.json: versions, devices, CPU features, cores.

Every figure in a report is only meaningful next to the machine it was measured on, so each
run directory records these. Collecting them is cheap (no benchmark runs unless asked for).
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

__all__ = ["collect_env", "cpu_flags", "cpu_model", "cpu_quota", "CPU_FLAGS"]

# CPU features that decide whether reduced precision pays on CPU:
#   avx512_bf16 / amx_bf16  native bf16 dot products (Cooper Lake+/Sapphire Rapids+); without
#                           them bf16 matmuls are emulated and slower than fp32
#   amx_tile                AMX tiles (oneDNN uses them for bf16/int8 matmuls)
#   avx512f / avx2          the fp32 vector width PyTorch kernels dispatch to
CPU_FLAGS: tuple[str, ...] = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx2")


def _read_text(path: str | Path) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> dict[str, bool]:
    """{flag: present} for CPU_FLAGS, from the first "flags" line of /proc/cpuinfo (absent file -> all False)."""
    text = _read_text(cpuinfo)
    found: set[str] = set()
    if text:
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                found = set(value.split())
                break
    return {flag: flag in found for flag in CPU_FLAGS}


def bf16_units(flags: dict[str, bool] | None = None) -> bool:
    """Whether the CPU has native bf16 dot products (avx512_bf16 or AMX), from `flags`
    (cpu_flags()'s, read now when None): without them a bf16 matmul is emulated, far slower."""
    flags = cpu_flags() if flags is None else flags
    return bool(flags.get("avx512_bf16") or flags.get("amx_bf16"))


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    text = _read_text(cpuinfo)
    if text:
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def cpu_quota(cgroup_root: str | Path = "/sys/fs/cgroup") -> float | None:
    """CPUs this container may use per the cgroup CPU quota (e.g. 2.0), or None when unlimited/unknown.

    Containers often show all host cores in os.cpu_count() while the quota allows a few;
    sizing DataLoader workers by the host count then oversubscribes the quota.
    """
    root = Path(cgroup_root)
    text = _read_text(root / "cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"
    if text:
        parts = text.split()
        if len(parts) == 2 and parts[0] != "max":
            try:
                return int(parts[0]) / int(parts[1])
            except (ValueError, ZeroDivisionError):
                return None
        return None
    quota = _read_text(root / "cpu" / "cpu.cfs_quota_us")  # cgroup v1
    period = _read_text(root / "cpu" / "cpu.cfs_period_us")
    try:
        q, p = int((quota or "").strip()), int((period or "").strip())
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _available_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _nvml_available() -> bool:
    try:
        import pynvml  # optional extra trainspeed[nvml]
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def _devices(torch: Any) -> list[dict[str, Any]]:
    from trainspeed.telemetry.peaks import DTYPES, lookup_peak

    out = []
    if not torch.cuda.is_available():
        return out
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        peaks = {}
        for d in DTYPES:
            p = lookup_peak(props.name, d)
            peaks[d] = p.flops if p else None
        out.append(
            {
                "index": i,
                "name": props.name,
                "memory_total": int(props.total_memory),
                "capability": f"{props.major}.{props.minor}",
                "multiprocessors": int(props.multi_processor_count),
                "peak_flops": peaks,  # datasheet, dense; None when not in the table
            }
        )
    return out


def collect_env(*, device: Any = None, precision: str | None = None, measure_peak: bool = False) -> dict[str, Any]:
    """The env.json dict (schema 1).

    With `precision` (e.g. "bf16-mixed") the top-level "peak_flops" names the peak MFU will use
    on `device` (default: cuda:0 if present, else cpu): the datasheet row, or - only when
    `measure_peak` - a timed matmul. Without it no peak is chosen (the precision is unknown).
    """
    import psutil
    import torch

    import trainspeed

    flags = cpu_flags()
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # older torch
        capability = None
    env: dict[str, Any] = {
        "schema": 1,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": bool(torch.cuda.is_available()),
        "devices": _devices(torch),
        "cpu": {
            "model": cpu_model(),
            "physical_cores": psutil.cpu_count(logical=False),
            "logical_cores": psutil.cpu_count(logical=True),
            "available_cores": _available_cores(),
            "quota": cpu_quota(),
            "torch_threads": torch.get_num_threads(),
            "capability": capability,
            "flags": flags,
            "bf16_fast": bf16_units(flags),
        },
        "host_memory": int(psutil.virtual_memory().total),
        "nvml": _nvml_available(),
        "trainspeed": trainspeed.__version__,
        "hostname": socket.gethostname(),
    }
    if precision is not None:
        from trainspeed.telemetry.peaks import dtype_for_precision, peak_for

        dev = device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
        peak = peak_for(dev, dtype_for_precision(precision), measure_if_unknown=measure_peak)
        env["peak_flops"] = peak.as_dict() if peak is not None else None
    return env
