"""Backward hooks: `Tensor.backward` and `torch.autograd.backward` are the "backward" phase.

`Tensor.backward` calls `torch.autograd.backward`, so a depth counter keeps one phase per
backward. The scalar being differentiated is kept (detached, on its device: no sync) as the
step's loss; the number of backward calls per optimizer step reveals gradient accumulation.
"""

from __future__ import annotations

from typing import Any

import torch

from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session


def _make(session: Session, original: Any) -> Any:
    def backward(*args: Any, **kwargs: Any) -> Any:
        s = session
        if s.bwd_depth or not s.on():
            return original(*args, **kwargs)
        s.close_eval()
        s.bwd_depth = 1
        s.step_backwards += 1
        first = args[0] if args else kwargs.get("tensors", kwargs.get("self"))
        if isinstance(first, torch.Tensor) and first.numel() == 1:
            s.last_loss = first.detach()
        s.mon.begin("backward")
        try:
            return original(*args, **kwargs)
        finally:
            s.bwd_depth = 0
            s.mon.end("backward")

    backward.__wrapped__ = original  # type: ignore[attr-defined]
    return backward


def install(session: Session, patches: Patches) -> None:
    patches.wrap(torch.Tensor, "backward", lambda orig: _make(session, orig))
    patches.wrap(torch.autograd, "backward", lambda orig: _make(session, orig))
