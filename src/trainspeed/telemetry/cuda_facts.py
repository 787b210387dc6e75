"""What the checks need to know about a CUDA device (name, capability, memory, TF32, bf16), read
the same way for a foreign script (the doctor) and for the engine's own runs."""

from __future__ import annotations

from typing import Any


def cuda_device_facts() -> dict[str, Any]:
    """The current CUDA device's facts, or {} when CUDA was not initialized: reading them must
    not create a CUDA context for a CPU-only script."""
    import torch

    if not torch.cuda.is_initialized():
        return {}
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return {"name": props.name, "capability": f"{props.major}.{props.minor}",
            "total_memory": int(props.total_memory),
            "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "bf16_supported": bool(torch.cuda.is_bf16_supported())}


__all__ = ["cuda_device_facts"]
