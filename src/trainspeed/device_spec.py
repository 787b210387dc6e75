"""A run's device as a config names it ("auto", "cpu", "cuda", "cuda:1"), read the same way
wherever the device must be known before one is built: the fast variant's CUDA overlay, the
tune's device facts, the gpt recipe's attention order."""

from __future__ import annotations

from typing import Any


def cuda_index(spec: Any) -> int | None:
    """The CUDA device index `spec` names: "cuda" 0, "cuda:N" N, "auto" 0 when CUDA is available;
    None for any other device, and for "auto" without CUDA. "cuda" is taken at its word: whether
    CUDA is there is for the caller that needs the device to say."""
    spec = str(spec)
    if spec == "auto":
        import torch

        return 0 if torch.cuda.is_available() else None
    if not spec.startswith("cuda"):
        return None
    _, _, index = spec.partition(":")
    return int(index) if index else 0


__all__ = ["cuda_index"]
