"""Did a module's parameters change between two points of a loop without torch.optim?

A manual update written forward -> `model.zero_grad()` -> backward -> `p -= lr * p.grad`
leaves the gradients in place at the next forward, so they cannot tell the end of a step from
accumulation (session.py's "backward" boundary); the parameters' change can. A mark holds the
first few trainable parameters' version (`p -= ...` under no_grad bumps it), storage
(`p.data = ...` replaces it) and, on the CPU, a few values (`p.data.add_(...)` bumps no
version). A GPU value is never read (a sync): an update through `.data` there goes unseen.
"""

from __future__ import annotations

from typing import Any

import torch

PARAMS = 4
VALUES = 16

Mark = list[tuple[int, int, Any]]


def _trainable(module: torch.nn.Module):
    return (p for p in module.parameters() if p.requires_grad)


def mark_params(module: torch.nn.Module) -> Mark:
    """The module's first trainable parameters as they are now (cheap: a few small copies)."""
    marks: Mark = []
    for p in _trainable(module):
        head = p.detach().reshape(-1)[:VALUES].clone() if p.device.type == "cpu" else None
        marks.append((p._version, p.data_ptr(), head))  # noqa: SLF001 - torch's version counter
        if len(marks) >= PARAMS:
            break
    return marks


def params_moved(module: torch.nn.Module, marks: Mark) -> bool:
    """Did any marked parameter change since `mark_params` (False without a mark)?"""
    for (version, ptr, head), p in zip(marks, _trainable(module)):
        if p._version != version or p.data_ptr() != ptr:  # noqa: SLF001
            return True
        if head is not None and not torch.equal(p.detach().reshape(-1)[:VALUES], head):
            return True
    return False
