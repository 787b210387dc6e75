"""Which SDPA backend the gpt recipe's attention asks for first, on the device it runs on.

torch's scaled_dot_product_attention takes the first eligible backend of a priority order. On
Hopper GPUs (compute capability 9.x: H100, H200) cuDNN's fused attention trains 1.7-2.3x faster
than FlashAttention-2 at the same accuracy, and it is slower on Ampere (transformers PR #48163,
benchmarked on six GPUs). Recent torch already puts cuDNN first there
(`check_prefer_cudnn_attention`: sm90/sm100 with cuDNN >= 9.15, unless
TORCH_CUDNN_SDPA_DEPRIORITIZED is set); older releases put FlashAttention-2 first. So "auto"
asks for cuDNN first on capability 9 whatever the torch, keeping the others behind it for
shapes cuDNN cannot serve, and leaves torch's own order elsewhere. The order is set with
`sdpa_kernel(..., set_priority=True)` inside the attention's forward, which torch.compile
traces (inductor fixes the backend at trace time, so a context entered around a compiled call
would do nothing).
"""

from __future__ import annotations

import inspect
from typing import Any

def cuda_capability_major(device_spec: str) -> int | None:
    """The compute capability's major number of the run's CUDA device (None: not CUDA, or no
    CUDA here)."""
    import torch

    from trainspeed.device_spec import cuda_index

    index = cuda_index(device_spec)
    if index is None or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(index)[0]


def sdpa_order(choice: str, capability_major: int | None) -> list[Any] | None:
    """The backend priority for `sdpa_kernel(order, set_priority=True)`, or None for torch's
    own order. Needs a torch whose sdpa_kernel takes set_priority (2.6 and later)."""
    if choice == "torch" or capability_major is None:
        return None
    if choice == "auto" and capability_major != 9:
        return None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if "set_priority" not in inspect.signature(sdpa_kernel).parameters:
        return None
    return [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
            SDPBackend.MATH]


__all__ = ["cuda_capability_major", "sdpa_order"]
