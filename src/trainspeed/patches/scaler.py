"""fp16's GradScaler, added to an unchanged loop: the training loss is scaled in
`Tensor.backward`, and each optimizer's `step()` goes through `scaler.step(opt)` followed by
`scaler.update()`. Hazard (in a note): a script that clips gradients between backward and
step clips the scaled gradients; bf16 needs no scaler and has no such hazard.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from trainspeed.patches.context import InstallContext

_TORCH = os.path.dirname(torch.__file__) + os.sep


def install_grad_scaler(ctx: InstallContext) -> None:
    state: dict[str, Any] = {"scaler": None, "inside": False}

    def scaler_for(device: str) -> Any:
        if state["scaler"] is None:
            state["scaler"] = torch.amp.GradScaler(device)
        return state["scaler"]

    original_backward = torch.Tensor.backward

    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_code.co_filename
        # The training loss: a scalar with a graph, backwarded by the script (not by torch itself).
        if (ctx.shared.get("scale_losses") and self.dim() == 0 and self.requires_grad
                and not caller.startswith(_TORCH)):
            return original_backward(scaler_for(self.device.type).scale(self), *args, **kwargs)
        return original_backward(self, *args, **kwargs)

    ctx.patches.setattr(torch.Tensor, "backward", backward)
    original_init = torch.optim.Optimizer.__init__

    def __init__(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        original_init(opt, *args, **kwargs)
        step = opt.step

        def scaled_step(*a: Any, **k: Any) -> Any:
            scaler = state["scaler"]
            if state["inside"] or scaler is None:  # scaler.step calls opt.step itself
                return step(*a, **k)
            # GradScaler.step asserts when no gradient was unscaled (an optimizer whose
            # parameters got none this step); any() stops at the first parameter with one
            if not any(p.grad is not None for group in opt.param_groups for p in group["params"]):
                return step(*a, **k)
            state["inside"] = True
            try:
                result = scaler.step(opt, *a, **k)
                scaler.update()
                return result
            finally:
                state["inside"] = False

        opt.step = scaled_step  # type: ignore[method-assign]

    ctx.patches.setattr(torch.optim.Optimizer, "__init__", __init__)
    ctx.note("precision=fp16: losses are scaled by a GradScaler and optimizer steps unscale them; "
             "gradient clipping in the script sees scaled gradients")
