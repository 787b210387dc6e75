"""Peak FLOP/s per device and dtype: the denominator of MFU.

Dense numbers only (no 2:4 sparsity): vendor datasheets print the sparse figure with an
asterisk, and dividing by it halves every MFU. Tensor-core figures for fp16/bf16 are the
"FP32 accumulate" ones, which is what PyTorch matmuls use. When a device is not in the table
the peak is measured with a timed matmul and labelled "measured", so a report always says
which peak its MFU is relative to.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainspeed.errors import ConfigError

if TYPE_CHECKING:  # torch is imported lazily: `trainspeed env --help` must stay instant
    import torch

__all__ = ["PeakFlops", "PEAK_TABLE", "DTYPES", "lookup_peak", "measure_matmul_peak", "peak_for", "dtype_for_precision"]

DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp64")
T = 1e12


@dataclass(kw_only=True, slots=True, frozen=True)
class PeakFlops:
    """A peak FLOP/s figure and where it came from."""

    name: str
    """Device name as shown in reports, e.g. "NVIDIA H100 SXM"."""
    dtype: str
    """One of DTYPES."""
    flops: float
    """Dense peak FLOP/s."""
    source: str
    """"table" (vendor datasheet) or "measured" (timed matmul on this machine)."""
    cached: bool = False
    """A measured peak read from the per-machine cache (telemetry/peak_cache.py), not timed now."""
    measured_at: float | None = None
    """Unix time the measured peak was timed (this run, or the run that filled the cache)."""
    cores_used: float | None = None
    """CPU only: the cores this process had during the fastest timed matmul (CPU time / wall).
    Fewer than its threads means other processes held the cores and the figure is low."""
    quiet: bool | None = None
    """A measured peak: timed while this process had the cores its threads need (see
    peak_cache: a figure timed on a busy machine is measured again by later runs)."""

    @property
    def label(self) -> str:
        how = "datasheet" if self.source == "table" else "measured matmul"
        return f"{self.name} {self.dtype} ({how})"

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name, "dtype": self.dtype, "flops": self.flops, "source": self.source}
        if self.measured_at is not None:  # a measured peak (cached or timed now)
            out.update(cached=self.cached, measured_at=self.measured_at, quiet=self.quiet)
        return out


@dataclass(frozen=True, slots=True)
class _Row:
    pattern: str  # regex searched case-insensitively in torch.cuda.get_device_name()
    name: str
    fp32: float
    tf32: float
    bf16: float | None  # None: no native bf16 units, MFU against an emulated path is meaningless
    fp16: float
    fp64: float | None = None  # None: the datasheet gives no FP64 figure (consumer and inference parts)


# Rows are tried in order; the first whose pattern matches wins, so specific variants
# (PCIe, NVL) come before the family default. \b keeps "A10" from matching "A100"/"A10G"
# and "L4" from matching "L40S".
# On pre-Ampere parts TF32 does not exist: allow_tf32 is ignored and matmuls run in fp32,
# so their tf32 entry is the fp32 peak.
# FP64 (the last column, where given): the same datasheets' FP64 Tensor Core figure on A100/H100/
# H200 (cuBLAS runs float64 matmuls on those units), FP64 on V100.
PEAK_TABLE: tuple[_Row, ...] = (
    # NVIDIA H100 NVL datasheet (per GPU, 94 GB): FP32 60 TF; TF32 835*, BF16/FP16 1,671* (*sparse, halved).
    _Row(r"\bH100\b.*\bNVL\b", "NVIDIA H100 NVL", 60 * T, 417.5 * T, 835.5 * T, 835.5 * T, fp64=60 * T),
    # NVIDIA H100 datasheet, PCIe column: FP32 51 TF; TF32 756*, BF16/FP16 1,513* (*sparse, halved).
    _Row(r"\bH100\b.*\bPCIe\b", "NVIDIA H100 PCIe", 51 * T, 378 * T, 756.5 * T, 756.5 * T, fp64=51 * T),
    # NVIDIA H100 datasheet, SXM column ("NVIDIA H100 80GB HBM3"): FP32 67 TF; TF32 989*, BF16/FP16 1,979*.
    _Row(r"\bH100\b", "NVIDIA H100 SXM", 67 * T, 494.7 * T, 989.4 * T, 989.4 * T, fp64=67 * T),
    # NVIDIA H200 datasheet, NVL column: FP32 60 TF; TF32 835*, BF16/FP16 1,671* (*sparse, halved).
    _Row(r"\bH200\b.*\bNVL\b", "NVIDIA H200 NVL", 60 * T, 417.5 * T, 835.5 * T, 835.5 * T, fp64=60 * T),
    # NVIDIA H200 datasheet, SXM column: FP32 67 TF; TF32 989*, BF16/FP16 1,979* (same die as H100 SXM).
    _Row(r"\bH200\b", "NVIDIA H200 SXM", 67 * T, 494.7 * T, 989.4 * T, 989.4 * T, fp64=67 * T),
    # NVIDIA A100 datasheet (40/80 GB): PCIe and SXM list the same peaks: FP32 19.5; TF32 156; BF16/FP16 312.
    _Row(r"\bA100\b.*\bPCIe\b", "NVIDIA A100 PCIe", 19.5 * T, 156 * T, 312 * T, 312 * T, fp64=19.5 * T),
    _Row(r"\bA100\b", "NVIDIA A100 SXM", 19.5 * T, 156 * T, 312 * T, 312 * T, fp64=19.5 * T),
    # NVIDIA L40S datasheet: FP32 91.6; TF32 183; BF16/FP16 362.05 (dense columns).
    _Row(r"\bL40S\b", "NVIDIA L40S", 91.6 * T, 183 * T, 362.05 * T, 362.05 * T),
    # NVIDIA L4 datasheet: FP32 30.3; TF32 120*, BF16/FP16 242* (*sparse, halved).
    _Row(r"\bL4\b", "NVIDIA L4", 30.3 * T, 60 * T, 121 * T, 121 * T),
    # A10G (AWS G5) has no public NVIDIA datasheet; figures as published by AWS partners
    # (e.g. Baseten, "NVIDIA A10 vs A10G"): FP32 31.52; TF32 35; BF16/FP16 70.
    _Row(r"\bA10G\b", "NVIDIA A10G", 31.52 * T, 35 * T, 70 * T, 70 * T),
    # NVIDIA A10 datasheet: FP32 31.2; TF32 62.5; BF16/FP16 125 (dense).
    _Row(r"\bA10\b", "NVIDIA A10", 31.2 * T, 62.5 * T, 125 * T, 125 * T),
    # NVIDIA Ada Lovelace architecture whitepaper, Appendix (RTX 4090): FP32 82.6; TF32 82.6;
    # FP16/BF16 tensor with FP32 accumulate 165.2 (GeForce runs FP32-accumulate at half rate).
    _Row(r"\bRTX 4090\b(?!\s*D\b)", "NVIDIA GeForce RTX 4090", 82.6 * T, 82.6 * T, 165.2 * T, 165.2 * T),
    # NVIDIA Ampere GA102 whitepaper, Appendix A (RTX 3090): FP32 35.6; TF32 35.6;
    # FP16/BF16 tensor with FP32 accumulate 71.
    _Row(r"\bRTX 3090\b(?!\s*Ti\b)", "NVIDIA GeForce RTX 3090", 35.6 * T, 35.6 * T, 71 * T, 71 * T),
    # NVIDIA V100 datasheet: V100S PCIe FP32 16.4 / tensor 130; SXM2 15.7 / 125; PCIe 14 / 112. No bf16/tf32.
    _Row(r"\bV100S\b", "NVIDIA V100S PCIe", 16.4 * T, 16.4 * T, None, 130 * T, fp64=8.2 * T),
    _Row(r"\bV100\b.*\bPCIe\b", "NVIDIA V100 PCIe", 14 * T, 14 * T, None, 112 * T, fp64=7 * T),
    _Row(r"\bV100\b", "NVIDIA V100 SXM2", 15.7 * T, 15.7 * T, None, 125 * T, fp64=7.8 * T),
    # NVIDIA T4 datasheet: FP32 8.1; mixed FP16/FP32 tensor 65. No bf16/tf32.
    _Row(r"\bT4\b", "NVIDIA T4", 8.1 * T, 8.1 * T, None, 65 * T),
)

_PRECISION_TO_DTYPE = {
    "fp32": "fp32",
    "32": "fp32",
    "tf32": "tf32",
    "bf16-mixed": "bf16",
    "bf16": "bf16",
    "bf16-true": "bf16",
    "fp16-mixed": "fp16",
    "fp16": "fp16",
    "16-mixed": "fp16",
    "fp64": "fp64",
    "64": "fp64",
    "64-true": "fp64",
}


def dtype_for_precision(precision: str) -> str:
    """The matmul dtype a precision setting runs at: "bf16-mixed" -> "bf16", "tf32" -> "tf32", ..."""
    key = str(precision).strip().lower()
    if key not in _PRECISION_TO_DTYPE:
        allowed = ", ".join(sorted(_PRECISION_TO_DTYPE))
        raise ConfigError(f"precision must be one of {allowed}; got {precision!r}")
    return _PRECISION_TO_DTYPE[key]


def _check_dtype(dtype: str) -> str:
    d = str(dtype).lower()
    if d not in DTYPES:
        raise ConfigError(f"peak dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return d


def lookup_peak(device_name: str, dtype: str) -> PeakFlops | None:
    """Datasheet peak for a torch.cuda.get_device_name() string, or None when not in the table
    (or when the device has no native units for `dtype`, e.g. bf16 on a V100)."""
    d = _check_dtype(dtype)
    for row in PEAK_TABLE:
        if re.search(row.pattern, device_name or "", flags=re.IGNORECASE):
            flops = getattr(row, d)
            if flops is None:
                return None
            return PeakFlops(name=row.name, dtype=d, flops=float(flops), source="table")
    return None


_TORCH_DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def measure_matmul_peak(
    device: "torch.device | str" = "cpu",
    dtype: "torch.dtype | None" = None,
    n: int = 1024,
    repeats: int = 5,
    budget_s: float = 2.0,
) -> PeakFlops:
    """Best-of-`repeats` FLOP/s of an n x n x n torch.matmul (2*n^3 FLOPs) on `device`.

    This is an achievable peak, not a theoretical one: MFU against it reads as "fraction of
    what a large matmul reaches on this machine". It runs eagerly and synchronizes, so call it
    once at setup, never inside the training loop. Repeats stop early once `budget_s` seconds
    are spent (an emulated dtype on CPU, e.g. fp16 without native units, can take seconds per
    matmul); at least one timed repeat always runs.
    """
    import torch

    if n < 1 or repeats < 1:
        raise ConfigError(f"measure_matmul_peak needs n >= 1 and repeats >= 1; got n={n}, repeats={repeats}")
    dtype = torch.float32 if dtype is None else dtype
    dev = torch.device(device)
    dname = _TORCH_DTYPE_NAMES.get(str(dtype).replace("torch.", ""), str(dtype).replace("torch.", ""))
    if dev.type == "cuda" and dname == "fp32" and torch.backends.cuda.matmul.allow_tf32:
        dname = "tf32"  # fp32 matmuls run on TF32 tensor cores when this flag is set
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=dev, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=dev, dtype=dtype)
    flops = 2.0 * n**3
    best = float("inf")
    with torch.no_grad():
        torch.matmul(a, b)  # warm-up: kernel selection, allocator, thread pool start
        if dev.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(dev)  # deliberate sync: setup-time measurement, not in the loop
            for _ in range(repeats):
                start.record()
                torch.matmul(a, b)
                stop.record()
                stop.synchronize()  # deliberate sync: read the event pair of this repeat
                best = min(best, start.elapsed_time(stop) / 1e3)
        else:
            spent, cores_used = 0.0, None
            for _ in range(repeats):
                c0, t0 = time.process_time(), time.perf_counter()
                torch.matmul(a, b)
                dt = time.perf_counter() - t0
                if dt < best:
                    best, cores_used = dt, (time.process_time() - c0) / dt if dt > 0 else None
                spent += dt
                if spent >= budget_s:
                    break
    best = max(best, 1e-9)
    if dev.type == "cuda":
        return PeakFlops(name=torch.cuda.get_device_name(dev), dtype=dname, flops=flops / best, source="measured")
    return PeakFlops(name=f"{dev.type} ({_cpu_threads()} threads)", dtype=dname, flops=flops / best,
                     source="measured", cores_used=cores_used)


QUIET_SHARE = 0.75
"""A CPU matmul timed with at least this share of the cores its threads can use counts as timed
on a quiet machine. Beside 4 busy processes on 2 cores, 2 threads got ~0.7 cores (a share of
0.35) and the figure cached was 86 GFLOP/s against 194-214 alone: nanoGPT's baby model then
read MFU 129 %. Beside one busy process they got 1.26 cores (0.63); alone 1.76-2.17 (0.88+).
Where a 1024 matmul cannot use every thread (many cores), no timing counts as quiet: each run
times it again (~0.1 s) and the cache keeps the highest figure, which is the safe side."""


def timed_quietly(peak: PeakFlops) -> bool:
    """Whether `peak` was timed while this process had its cores (always, for a GPU timing)."""
    if peak.cores_used is None:
        return True
    from trainspeed.telemetry.loader_facts import available_cores

    usable = max(1, min(_cpu_threads(), available_cores() or 1))
    return peak.cores_used >= QUIET_SHARE * usable


def _cpu_threads() -> int:
    import torch

    return torch.get_num_threads()


@functools.lru_cache(maxsize=32)
def _measured(device: str, dtype: str) -> PeakFlops:
    """The measured peak of (device, dtype): from the per-machine cache when it has one for this
    machine's key, else timed now and cached (peak_cache.py; TRAINSPEED_REMEASURE_PEAK=1 times
    it again). Kept for the process: one lookup per (device, dtype)."""
    import torch

    from trainspeed.telemetry.peak_cache import cached_measurement, machine_key

    dev = torch.device(device)
    flops, cached, when, quiet = cached_measurement(machine_key(device, dtype), lambda: _time_matmul(dev, dtype))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"{dev.type} ({_cpu_threads()} threads)"
    return PeakFlops(name=name, dtype=dtype, flops=flops, source="measured", cached=cached, measured_at=when,
                     quiet=quiet)


def _time_matmul(dev: "torch.device", dtype: str) -> tuple[float, bool]:
    """(FLOP/s of the timed matmul for `dtype`, whether it was timed on a quiet machine)."""
    import torch

    tdt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
           "fp64": torch.float64}[dtype]
    if dev.type == "cuda" and dtype in ("fp32", "tf32"):
        # TF32 is a mode of fp32 matmuls; set it only for the measurement and restore it.
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        try:
            return measure_matmul_peak(dev, tdt, n=4096, repeats=10).flops, True
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
    # CPU has no TF32: a "tf32" run executes fp32 matmuls. With bf16 units, a bf16 matmul of
    # 1024 runs on one thread (oneDNN, AMD EPYC with avx512_bf16: 1.0 cores of 2) and 2048 on
    # all of them; without, it is emulated and 2048 would take 8x the seconds 1024 does.
    from trainspeed.telemetry.cpu_facts import bf16_units

    peak = measure_matmul_peak(dev, tdt, n=2048 if dtype == "bf16" and bf16_units() else 1024)
    return peak.flops, timed_quietly(peak)


def peak_for(device: "torch.device | str", dtype: str, measure_if_unknown: bool = True) -> PeakFlops | None:
    """The peak MFU is computed against: the datasheet row for a known CUDA device, else (when
    allowed) a measured matmul peak, cached per machine on disk (peak_cache.py: the same key
    reuses the first measurement; TRAINSPEED_REMEASURE_PEAK=1 measures again)."""
    import torch

    d = _check_dtype(dtype)
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return None
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        found = lookup_peak(torch.cuda.get_device_name(index), d)
        if found is not None:
            return found
        dev = torch.device("cuda", index)
    if not measure_if_unknown:
        return None
    return _measured(str(dev), d)


def record_peak(monitor: Any, device: "torch.device | str", dtype: str, *,
                measure_if_unknown: bool = True) -> None:
    """Record the peak MFU is computed against as a `peak_flops` event of `monitor`; a
    failure is a warning event, never an error (MFU is optional, the run is not)."""
    try:
        peak = peak_for(device, dtype, measure_if_unknown=measure_if_unknown)
    except Exception as exc:  # noqa: BLE001 - MFU is optional
        monitor.event("warning", message=f"peak FLOP/s unknown: {exc}")
        return
    if peak is not None:
        monitor.event("peak_flops", **peak.as_dict())
        _note_in_env(monitor, peak)


def _note_in_env(monitor: Any, peak: PeakFlops) -> None:
    """env.json (written at the Monitor's start) names the peak MFU uses and, when measured,
    whether it came from the per-machine cache and when it was timed. Setup time, rank 0."""
    import json

    run_dir = getattr(monitor, "run_dir", None)
    if run_dir is None or getattr(monitor, "rank", 0) != 0:
        return
    from trainspeed.telemetry import schema
    from trainspeed.telemetry.jsonfile import write_json

    path = run_dir / schema.ENV_FILE
    try:
        env = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"schema": 1}
        env["peak_flops"] = peak.as_dict()
        write_json(path, env)
    except (OSError, ValueError):
        pass  # the peak_flops event carries the same facts
