"""Environment facts for env.json: versions, devices, CPU features, cores.

Every figure in a report is only meaningful next to the machine it was measured on, so each
run directory records these. Collecting them is cheap (no benchmark runs unless asked for).
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

# The CPU facts live in cpu_facts (a leaf the peak code reads); re-exported here.
from trainspeed.telemetry.cpu_facts import CPU_FLAGS, bf16_units, cpu_flags, cpu_model, cpu_quota
from trainspeed.telemetry.scheduler import env_record

__all__ = ["ALLOC_CONF_VARS", "alloc_conf", "collect_env", "cpu_flags", "cpu_model", "cpu_quota", "CPU_FLAGS",
           "bf16_units", "expandable_segments_on"]

ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
"""The caching allocator's settings, in the order torch reads them (PYTORCH_ALLOC_CONF from
torch 2.9 on; PYTORCH_CUDA_ALLOC_CONF before, and still read when the first is unset)."""


def alloc_conf(environ: Any = None) -> str | None:
    """The allocator settings the process starts with (`expandable_segments:True,...`), or None."""
    env = os.environ if environ is None else environ
    for name in ALLOC_CONF_VARS:
        if env.get(name):
            return str(env[name])
    return None


def expandable_segments_on(conf: str | None) -> bool:
    """Whether allocator settings turn expandable segments on (`expandable_segments:True`)."""
    for item in (conf or "").split(","):
        key, _, value = item.partition(":")
        if key.strip() == "expandable_segments":
            return value.strip().lower() == "true"
    return False


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
        "alloc_conf": alloc_conf(),
        "trainspeed": trainspeed.__version__,
        "hostname": socket.gethostname(),
        "slurm": env_record(),  # a restarted job continues the run that names it (engine/checkpoint/slurm.py)
    }
    if precision is not None:
        from trainspeed.telemetry.peaks import dtype_for_precision, peak_for

        dev = device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
        peak = peak_for(dev, dtype_for_precision(precision), measure_if_unknown=measure_peak)
        env["peak_flops"] = peak.as_dict() if peak is not None else None
    return env
