"""What the doctor reads off the script's own torch objects at a step boundary, never with
a device sync: the optimizer's learning rate, and whether a module's gradients were used
and cleared (a new step) or are still there (accumulation). Session calls these inside its
`internal` guard, so the reads are not seen by the hooks.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["grads_consumed", "optimizer_lr"]


def grads_consumed(module: torch.nn.Module) -> bool:
    """Were the last backward's gradients used and cleared (zero_grad, `p.grad = None`,
    `p.grad.zero_()`)? Still there, they are being accumulated over micro-batches. Only CPU
    gradients are read (reading a GPU tensor would be a sync): a GPU gradient still
    allocated counts as not consumed, unless zero_grad set it to None (its default)."""
    checked = 0
    for p in module.parameters():
        if not p.requires_grad:
            continue
        g = p.grad
        if g is not None and (g.device.type != "cpu" or bool(g.any())):
            return False
        checked += 1
        if checked >= 4:
            break
    return True


def optimizer_lr(optimizer: Any) -> float | None:
    """The first parameter group's learning rate, or None: no optimizer, no lr, or a tensor lr
    on an accelerator (reading it would need a sync)."""
    try:
        value = optimizer.param_groups[0].get("lr") if optimizer is not None else None
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            return float(value)
    except (AttributeError, IndexError, TypeError):
        pass
    return None
