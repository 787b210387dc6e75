"""A model compiled in place, seen as every other model: its forward hooks run around the call.

`model.compile()` (and the tune's compile knob) swap in `torch.compile(model._call_impl)`. The
global forward hooks then run inside dynamo's frame, where `is_compiling()` makes them do
nothing, so such a model had no forward phase and no sample count, and its report told its
author to call the module rather than its forward, which they already did.

`torch.compile` of a module's `_call_impl` is handed back wrapped: the doctor's own hooks run
around the compiled call, outside dynamo. What runs compiled is unchanged. Hooks that run
eagerly inside (after a graph break, or on an eager fallback) find the forward already open and
only count depth. Every other torch.compile call passes through untouched.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch
from torch import nn

from trainspeed.doctor.instrument.patching import Patches


def install(patches: Patches, *, pre: Sequence[Callable[..., None]], post: Callable[..., None]) -> None:
    """`pre`: the global forward pre-hooks in their order; `post`: the forward hook (always called)."""
    original = torch.compile
    active = [True]  # a model compiled during a run outlives the doctor: then a plain call

    def observed(module: nn.Module, compiled: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not active[0]:
                return compiled(*args, **kwargs)
            for hook in pre:
                hook(module, args)
            try:
                out = compiled(*args, **kwargs)
            except BaseException:
                post(module, args)
                raise
            post(module, args, out)
            return out
        return call

    @functools.wraps(original)
    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        compiled = original(model, *args, **kwargs)
        owner = getattr(model, "__self__", None)
        if isinstance(owner, nn.Module) and getattr(model, "__name__", None) == "_call_impl" and callable(compiled):
            return observed(owner, compiled)
        return compiled

    patches.setattr(torch, "compile", compile)
    patches.call_on_undo(lambda: active.__setitem__(0, False))
