"""Facts of a finished doctor run that both the script's own process (runner.py) and a training
process it started (spawned.py) record: the exit status, the precision the script trained in,
the matmul dtype and the peak its MFU is read against. A module of their own: spawned.py runs
inside runner's run and must not import it back."""

from __future__ import annotations

from typing import Any, Iterable


def exit_code_of(exc: SystemExit) -> int:
    """The process exit status Python would use for this SystemExit."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else code % 256
    return 1  # sys.exit("message"): printed to stderr, status 1


def script_precision_of(observations: Iterable[dict[str, Any]]) -> tuple[str, str] | None:
    """(precision, where it was seen) the script trained in when not fp32, else None: a
    DeepSpeed engine's config, else autocast on around the model's first forward ("bf16-mixed":
    nanoGPT with a bf16 autocast patched in was reported "fp32" at 1.28x the fp32 speed), else
    the parameters' dtype. The doctor's Monitor starts before the script chooses any of them,
    so its run_start says fp32."""
    observations = list(observations)
    engine = engine_precision_of(observations)
    if engine is not None:
        return engine, "deepspeed config"
    names = {"bfloat16": "bf16", "float16": "fp16"}
    for obs in observations:
        if obs.get("kind") != "model":
            continue
        if obs.get("param_dtype") == "float64":  # autocast leaves float64 ops as they are
            return "fp64", "the model's parameters"
        if obs.get("autocast") in names:
            return f"{names[obs['autocast']]}-mixed", "autocast around the model's forward"
        if obs.get("param_dtype") in names:
            return names[obs["param_dtype"]], "the model's parameters"
    return None


def engine_precision_of(observations: Iterable[dict[str, Any]]) -> str | None:
    """The precision a DeepSpeed engine's config trains in ("bf16", "fp16", "bf16-mixed"...),
    None without an engine or in fp32. The doctor's Monitor starts before the script chooses a
    precision, so its run_start says fp32; the engine, observed at its first step, knows."""
    from trainspeed.engine.deepspeed_facts import engine_precision

    for obs in observations:
        if obs.get("kind") == "deepspeed":
            return engine_precision(obs)
    return None


def matmul_dtype(models: Iterable[dict[str, Any]], device: str) -> str:
    """The dtype the script's matmuls ran at: a DeepSpeed engine's (its config: under its
    torch_autocast section the parameters stay fp32 and autocast is on only inside the engine,
    and under ZeRO-3 each rank holds a partition), else from the model observations: autocast's
    dtype, else the parameters' (half/bfloat16 models), else fp32 (tf32 when CUDA allows it)."""
    import torch

    from trainspeed.telemetry.peaks import dtype_for_precision

    found = script_precision_of(models)
    if found is not None:
        return dtype_for_precision(found[0])
    if device == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "fp32"


def record_peak(monitor: Any, observations: Iterable[dict[str, Any]], device: str) -> None:
    """Record the peak FLOP/s the summary's MFU is computed against.

    A GPU gets its datasheet row (no measurement: a 4096^2 matmul after the script could need
    memory the script left in use). A CPU running fp32 (or fp64) gets a measured matmul peak: six
    1024^3 matmuls, ~0.1 s on 2 cores; bf16 too where the CPU has bf16 units (avx512_bf16,
    amx_bf16: six 2048^3 matmuls, ~0.2 s on 2 EPYC cores). fp16, and bf16 without the units,
    are not measured here: emulated, they can take seconds per matmul."""
    from trainspeed.telemetry.cpu_facts import bf16_units
    from trainspeed.telemetry.peaks import record_peak as record

    dtype = matmul_dtype(observations, device)
    measure = device == "cpu" and (dtype in ("fp32", "fp64") or (dtype == "bf16" and bf16_units()))
    record(monitor, device, dtype, measure_if_unknown=measure)


__all__ = ["engine_precision_of", "exit_code_of", "matmul_dtype", "record_peak", "script_precision_of"]
