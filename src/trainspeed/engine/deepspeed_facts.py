"""What a DeepSpeed engine is running, read from the engine itself (no DeepSpeed import):
the settings the checks read (observation kind "deepspeed"), written by the doctor for a
foreign script's engine and by the Trainer for its own; and the one-process environment
DeepSpeed needs without a launcher. Shared by engine/ and doctor/ (which may import engine/).
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

# torch is imported where an engine's device is read, not here: `trainspeed report` reaches this
# module through the doctor's checks and needs no torch (1.4 s of start-up).

LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
"""Set by a launcher (deepspeed, torchrun); without any, the script runs as one process."""
MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE", "SLURM_PROCID")
"""Set by mpirun/srun: DeepSpeed discovers the ranks itself there."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_process_env(environ: Any = os.environ) -> dict[str, str]:
    """The variables to add so that DeepSpeed initializes as rank 0 of 1 ({} when a launcher or
    MPI set the ranks, or they are there already)."""
    if any(k in environ for k in LAUNCHER_ENV) or any(k in environ for k in MPI_ENV):
        return {}
    add = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    if "MASTER_ADDR" not in environ:
        add["MASTER_ADDR"] = "127.0.0.1"
    if "MASTER_PORT" not in environ:
        add["MASTER_PORT"] = str(_free_port())
    return add


def engine_precision(info: dict[str, Any]) -> str | None:
    """The precision an engine trains in, from its observed config: "bf16"/"fp16" (its bf16 or
    fp16 section: half-precision weights, an fp32 master copy in the optimizer),
    "bf16-mixed"/"fp16-mixed" (its torch_autocast section: fp32 weights, autocast matmuls), None
    in fp32."""
    if info.get("bf16") or info.get("fp16"):
        return "bf16" if info.get("bf16") else "fp16"
    if info.get("torch_autocast"):
        return "fp16-mixed" if info.get("torch_autocast_dtype") == "float16" else "bf16-mixed"
    return None


def ask(engine: Any, name: str) -> Any:
    """engine.name() as a plain value, None when this DeepSpeed version lacks it."""
    try:
        value = getattr(engine, name)()
    except Exception:  # noqa: BLE001 - an observation, never a crash of the user's run
        return None
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return bool(value) if hasattr(value, "__bool__") else str(value)


def _offloaded(engine: Any, name: str) -> str | bool | None:
    """Where ZeRO offloads the optimizer or the parameters to ("cpu", "nvme"), False when it
    does not, None when unknown. Its config is an object with a device (an enum)."""
    try:
        value = getattr(engine, name)()
    except Exception:  # noqa: BLE001 - an observation, never a crash of the user's run
        return None
    device = getattr(value, "device", None)
    name = str(getattr(device, "value", device)).lower()
    return name if value is not None and name not in ("none", "") else False


def _param_count(engine: Any) -> int | None:
    """Parameters of the engine's module, whole: under ZeRO-3 each rank holds a partition and
    p.numel() is 0 outside a forward, p.ds_numel the full size."""
    try:
        return int(sum(getattr(p, "ds_numel", None) or p.numel() for p in engine.module.parameters()))
    except Exception:  # noqa: BLE001 - an observation, never a crash of the user's run
        return None


def device_memory(device: Any, environ: Any = os.environ) -> dict[str, Any]:
    """The memory a rank on `device` trains in: a CUDA device's total memory (one per rank),
    else the machine's RAM (psutil), shared by this node's LOCAL_WORLD_SIZE processes."""
    import torch

    try:
        if isinstance(device, torch.device) and device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            return {"device_memory": int(props.total_memory), "device_memory_of": f"{props.name} memory",
                    "memory_shared_by": 1}
        import psutil

        return {"device_memory": int(psutil.virtual_memory().total), "device_memory_of": "machine RAM",
                "memory_shared_by": max(1, int(environ.get("LOCAL_WORLD_SIZE") or 1))}
    except Exception:  # noqa: BLE001 - an observation, never a crash of the user's run
        return {"device_memory": None}


def _device_type(device: Any) -> str | None:
    """"cuda", "cpu" (DS_ACCELERATOR=cpu), ...: the device the engine trains on."""
    import torch

    if isinstance(device, torch.device):
        return device.type
    return str(device).split(":")[0] if device is not None else None


def _autocast_dtype(engine: Any) -> str | None:
    """The dtype of DeepSpeed's own torch_autocast section, when it is on."""
    if not ask(engine, "torch_autocast_enabled"):
        return None
    try:
        return str(engine.torch_autocast_dtype()).replace("torch.", "")
    except Exception:  # noqa: BLE001 - an older DeepSpeed
        return None


def describe_engine(engine: Any) -> dict[str, Any]:
    """The settings a finding reads, from the engine's parsed config (one call per run)."""
    config = getattr(engine, "config", None)
    info = {
        "class": type(engine).__name__,
        "zero_stage": ask(engine, "zero_optimization_stage"),
        "bf16": ask(engine, "bfloat16_enabled"),
        "fp16": ask(engine, "fp16_enabled"),
        "torch_autocast": ask(engine, "torch_autocast_enabled"),
        "torch_autocast_dtype": _autocast_dtype(engine),
        "overlap_comm": ask(engine, "zero_overlap_comm"),
        "contiguous_gradients": ask(engine, "zero_contiguous_gradients"),
        "offload_optimizer": _offloaded(engine, "zero_offload_optimizer"),
        "offload_param": _offloaded(engine, "zero_offload_param"),
        "train_batch_size": ask(engine, "train_batch_size"),
        "micro_batch_size": ask(engine, "train_micro_batch_size_per_gpu"),
        "accumulation_steps": ask(engine, "gradient_accumulation_steps"),
        "dp_world_size": getattr(engine, "dp_world_size", None),
        "params": _param_count(engine),
        "device": _device_type(getattr(engine, "device", None)),
        **device_memory(getattr(engine, "device", None)),
        "gradient_clipping": ask(engine, "gradient_clipping"),
        "optimizer": type(getattr(engine, "optimizer", None)).__name__,
        "basic_optimizer": type(getattr(engine, "basic_optimizer", None)).__name__,
        "config": config if isinstance(config, str) else None,
        "version": getattr(sys.modules.get("deepspeed"), "__version__", None),
    }
    return info
