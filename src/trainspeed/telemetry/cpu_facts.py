"""CPU facts: the feature flags, model name and cgroup quota of this machine's CPU.

A leaf module (standard library only): env.json records these, and the peak-FLOP/s code
(peaks, peak_cache) reads them to decide what it may time, without importing env.
"""

from __future__ import annotations

import platform
from pathlib import Path

__all__ = ["CPU_FLAGS", "bf16_units", "cpu_flags", "cpu_model", "cpu_quota"]

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
