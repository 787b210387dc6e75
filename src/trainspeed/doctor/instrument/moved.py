"""Did a module's parameters change between two points of a loop without torch.optim?

A manual update written forward -> `model.zero_grad()` -> backward -> `p -= lr * p.grad`
leaves the gradients in place at the next forward, so they cannot tell the end of a step from
accumulation (session.py's "backward" boundary); the parameters' change can. A mark holds the
first few trainable parameters' version counter (`p -= ...` under no_grad bumps it), storage
(`p.data = ...` replaces it) and the `.data` tensors handed out since (`p.data.add_(...)`
bumps no version of the parameter, `.data` being a tensor with a counter of its own: it bumps
that one). No value is read, so no device is waited for: a CUDA update through `.data` is
seen as a CPU one is, on the same path. `install` makes `Parameter.data` hand its tensors to
the marks (a property over torch's own; undone with the other patches). A `.data` tensor taken
before the first mark (before the loop's first backward) and written through later goes
unseen: holding every parameter's `.data` tensors from the start would keep discarded models'
memory alive.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

PARAMS = 4
VIEWS = 32
"""`.data` tensors of one parameter kept per mark (the most recent): more between two marks is
an optimizer of its own writing through `.data`, which closes steps by its step()."""

_TENSOR_DATA = torch.Tensor.data  # torch's getset descriptor, what the property wraps


class Watch:
    """The `.data` tensors of one parameter handed out since a mark, with their versions then."""

    __slots__ = ("views", "seen")

    def __init__(self, views: Any = ()) -> None:
        self.views: deque[tuple[torch.Tensor, int]] = deque(views, maxlen=VIEWS)
        self.seen = False
        """A write already seen: a dropped tensor's, or `p.data = ...`."""

    def add(self, view: torch.Tensor) -> None:
        if len(self.views) == VIEWS:
            old, version = self.views[0]
            self.seen |= old._version != version  # noqa: SLF001 - torch's version counter
        self.views.append((view, view._version))  # noqa: SLF001

    def written(self) -> bool:
        return self.seen or any(v._version != version for v, version in self.views)  # noqa: SLF001

    def rebased(self) -> Watch:
        """The same tensors from now on (one kept by the script across steps is still seen)."""
        return Watch((v, v._version) for v, _ in self.views)  # noqa: SLF001


_WATCHED: dict[int, Watch] = {}
"""id(parameter) -> its Watch, for the parameters of the latest mark only."""

Mark = list[tuple[int, int, Watch]]


def _data_get(self: torch.Tensor) -> torch.Tensor:
    view = _TENSOR_DATA.__get__(self, type(self))
    watch = _WATCHED.get(id(self))
    if watch is not None:
        watch.add(view)
    return view


def _data_set(self: torch.Tensor, value: torch.Tensor) -> None:
    _TENSOR_DATA.__set__(self, value)
    watch = _WATCHED.get(id(self))
    if watch is not None:  # new storage (data_ptr tells it too, where the device has pointers)
        watch.seen = True


def install(session: Any, patches: Any) -> None:
    """`Parameter.data` hands the tensors it returns to the marks, until the patches are undone."""
    patches.setattr(torch.nn.Parameter, "data", property(_data_get, _data_set, doc=_TENSOR_DATA.__doc__))
    patches.call_on_undo(_WATCHED.clear)


def _trainable(module: torch.nn.Module):
    return (p for p in module.parameters() if p.requires_grad)


def mark_params(module: torch.nn.Module) -> Mark:
    """The module's first trainable parameters as they are now (no copies, no device reads)."""
    marks: Mark = []
    previous = dict(_WATCHED)
    _WATCHED.clear()
    for p in _trainable(module):
        old = previous.get(id(p))
        watch = _WATCHED[id(p)] = old.rebased() if old is not None else Watch()
        marks.append((p._version, p.data_ptr(), watch))  # noqa: SLF001
        if len(marks) >= PARAMS:
            break
    return marks


def params_moved(module: torch.nn.Module, marks: Mark) -> bool:
    """Did any marked parameter change since `mark_params` (False without a mark)?"""
    for (version, ptr, watch), p in zip(marks, _trainable(module)):
        if p._version != version or p.data_ptr() != ptr or watch.written():  # noqa: SLF001
            return True
    return False
