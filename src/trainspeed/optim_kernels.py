"""Which devices this torch has fused or multi-tensor (foreach) optimizer kernels for: the
engine's `optim.implementation: auto` and the doctor's optimizer finding read the same list."""

from __future__ import annotations

FUSED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")
"""torch.optim classes with a fused implementation (torch >= 2.4); every class takes foreach."""


def kernel_devices(kind: str) -> list[str]:
    """Device types with `kind` ("fused" or "foreach") optimizer kernels: torch's own list (the
    CPU's fused kernels came in 2.4), or CUDA alone, the documented minimum, where torch moved
    the private helper that says."""
    try:
        from torch.utils import _foreach_utils as fu

        fn = fu._get_fused_kernels_supported_devices if kind == "fused" else fu._get_foreach_kernels_supported_devices
        return list(fn())
    except (ImportError, AttributeError):
        return ["cuda"]


__all__ = ["FUSED_OPTIMIZERS", "kernel_devices"]
