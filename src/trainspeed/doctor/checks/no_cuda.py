"""A script that asks for CUDA on a machine without it: the flag that runs it on the CPU.

Many scripts default to the GPU (timm's train.py: `--device cuda`; pytorch/examples'
`--no-accel`, `--no-cuda` switches off). On a CPU machine they stop before their first step
with "CUDA is not available but cuda was specified" or "Torch not compiled with CUDA enabled".
The fix the user can run is the script's own flag, read from what it parsed.
"""

from __future__ import annotations

from trainspeed.doctor.checks.context import CheckContext
from trainspeed.doctor.checks.script_flags import script_flag, set_flag, show_flag

NO_CUDA_ERRORS = ("cuda is not available", "torch not compiled with cuda enabled", "no cuda gpus are available",
                  "found no nvidia driver", "cuda was specified", "torch.cuda.is_available() is false",
                  "no cuda-capable device")
"""Lower-case parts of the errors torch and scripts raise when CUDA was asked for and is absent."""


def asks_for_missing_cuda(error: str) -> bool:
    lowered = error.lower()
    return any(part in lowered for part in NO_CUDA_ERRORS)


def cpu_advice(ctx: CheckContext, error: str) -> tuple[str, str] | None:
    """(what to do, the doctor command that does it) for a run that asked for a CUDA device this
    machine lacks, or None when the error is another one."""
    if not asks_for_missing_cuda(error):
        return None
    device = script_flag(ctx, "device")
    if device is not None and any(w in str(device.get("value")).lower() for w in ("cuda", "gpu")):
        arg = set_flag(device, "cpu")
    else:
        switch = script_flag(ctx, "cpu_switch")
        arg = set_flag(switch, True) if switch is not None and switch.get("kind") == "storetrue" \
            and switch.get("value") is False else None
        device = switch if arg else None
    if device is None or arg is None:
        return ("this machine has no CUDA device the script can use: run it with its option for the CPU "
                "(it has no --device flag the doctor saw), or on a machine with a GPU",
                ctx.doctor_command())
    return (f"this machine has no CUDA device: run on the CPU with the script's flag, {arg} "
            f"(now {show_flag(device)})", ctx.doctor_command(flags=[arg]))


__all__ = ["NO_CUDA_ERRORS", "asks_for_missing_cuda", "cpu_advice"]
