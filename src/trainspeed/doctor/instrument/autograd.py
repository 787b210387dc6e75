"""Autograd hooks: backward phases, and the step boundaries and batches they imply.

- `Tensor.backward` and `torch.autograd.backward` are the "backward" phase. `Tensor.backward`
  calls `torch.autograd.backward`, so a depth counter keeps one phase per backward. The
  scalar being differentiated is the step's loss (kept detached, on its device: no sync;
  `GradScaler.scale` is seen through so an fp16 loss is not reported x65536); the number of
  backward calls per step reveals gradient accumulation.
- Optimizer step pre/post hooks keep `session.opt_depth`: forwards and backwards inside
  `optimizer.step(closure)` are closure evaluations of one batch (LBFGS), not micro-batches.
- A global forward pre-hook, first in line (before module.py's "forward" phase opens), tells
  the session about each outermost training forward: the training module's forward after a
  backward closes a step in loops without an optimizer, and its input is the step's batch
  when no DataLoader gave one (see session.py). Inside the training module it probes the first
  sequence-first layer once, for the batch dimension of a sequence-first model's input.
- The exit of a `torch.no_grad()` / `inference_mode()` / `set_grad_enabled(False)` block
  that turns gradients back on ends an evaluation that iterated no DataLoader: the work after
  it (plotting a prediction, say) is not evaluation.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch.autograd import grad_mode
from torch.nn.modules import module as module_mod
from torch.optim import optimizer as optim_mod

from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.batch import SEQ_FIRST_TYPES
from trainspeed.doctor.instrument.session import Session


def _make_backward(session: Session, original: Any) -> Any:
    def backward(*args: Any, **kwargs: Any) -> Any:
        s = session
        if s.bwd_depth or not s.on():
            return original(*args, **kwargs)
        s.close_eval()
        s.bwd_depth = 1
        first = args[0] if args else kwargs.get("tensors", kwargs.get("self"))
        unscaled = None
        pending, s.scaled_loss = s.scaled_loss, None
        if pending is not None and pending[0]() is first:
            unscaled = pending[1]
        s.on_backward(first, unscaled)
        s.mon.begin("backward")
        try:
            return original(*args, **kwargs)
        finally:
            s.bwd_depth = 0
            s.mon.end("backward")

    backward.__wrapped__ = original  # type: ignore[attr-defined]
    return backward


def _make_scale(session: Session, original: Any) -> Any:
    def scale(self: Any, outputs: Any) -> Any:
        result = original(self, outputs)
        s = session
        if s.on() and isinstance(outputs, torch.Tensor) and result is not outputs:
            # the scaled tensor is about to be backwarded; its unscaled loss is the loss
            s.scaled_loss = (weakref.ref(result), outputs)
        return result

    scale.__wrapped__ = original  # type: ignore[attr-defined]
    return scale


def _make_exit(session: Session, original: Any) -> Any:
    def __exit__(self: Any, *exc: Any) -> Any:
        result = original(self, *exc)
        s = session
        if (s.eval_open and not s.eval_loader and not s.eval_rollout and not s.fwd_depth and s.on()
                and torch.is_grad_enabled()):
            s.close_eval()
        return result

    __exit__.__wrapped__ = original  # type: ignore[attr-defined]
    return __exit__


def install(session: Session, patches: Patches) -> Callable[..., None]:
    """Returns the training-forward pre-hook, which compiled_calls.py also runs around a model
    compiled in place."""
    patches.wrap(torch.Tensor, "backward", lambda orig: _make_backward(session, orig))
    patches.wrap(torch.autograd, "backward", lambda orig: _make_backward(session, orig))
    patches.wrap(torch.amp.GradScaler, "scale", lambda orig: _make_scale(session, orig))
    for cls in (grad_mode.no_grad, grad_mode.inference_mode, grad_mode.set_grad_enabled):
        patches.wrap(cls, "__exit__", lambda orig: _make_exit(session, orig))

    # Registered before optimizer.py's hooks, so they run first: the step's post-hook sees
    # opt_depth back at 0.
    def opt_pre(opt: Any, args: Any, kwargs: Any) -> None:
        if session.on():
            session.opt_depth += 1

    def opt_post(opt: Any, args: Any, kwargs: Any) -> None:
        if session.on() and session.opt_depth:
            session.opt_depth -= 1

    patches.handle(optim_mod.register_optimizer_step_pre_hook(opt_pre))
    patches.handle(optim_mod.register_optimizer_step_post_hook(opt_post))

    is_compiling = torch.compiler.is_compiling

    def forward_pre(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if is_compiling():
            return None
        s = session
        if s.fwd_depth:  # inside a forward (module.py keeps the depth)
            if s.seq_probe is not None and isinstance(module, SEQ_FIRST_TYPES) and s.on():
                s.probe_sequence_layer(module, args)
            return None
        if not s.on() or s.in_data or not module.training or not torch.is_grad_enabled():
            return None  # in_data: a dataset's module transforms are the data pipeline (module.py)
        s.on_train_forward(module, args)
        return None

    handle = module_mod.register_module_forward_pre_hook(forward_pre)
    try:  # first in line: a step closed here ends before the forward phase begins
        module_mod._global_forward_pre_hooks.move_to_end(handle.id, last=False)  # noqa: SLF001
    except (AttributeError, KeyError):
        pass  # later in line, the step ends a few microseconds into the forward
    patches.handle(handle)
    return forward_pre
