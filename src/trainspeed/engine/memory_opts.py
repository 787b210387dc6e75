"""Memory-layout switches: activation checkpointing and channels_last.

Activation checkpointing trades compute for memory: a checkpointed block keeps only its
inputs during the forward pass and recomputes its activations in the backward pass (one
extra forward per block, usually +20-35% step time), which frees room for a larger batch.
Gradients are unchanged: the recompute replays the same RNG state (dropout matches).

channels_last (NHWC) lets cuDNN / oneDNN convolutions skip layout transposes; it helps
convolutional models under mixed precision on tensor-core GPUs and is neutral or worse
elsewhere, which is why it is a measured switch.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainspeed.errors import ConfigError

__all__ = ["apply_activation_checkpointing", "is_checkpointed", "apply_channels_last", "to_channels_last"]

_MARK = "_trainspeed_checkpointed"


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    # The class's own forward, looked up at call time: binding it here (not capturing the
    # original bound method in a closure) keeps copy.deepcopy(model) pointing at the copy.
    forward = type(self).forward.__get__(self)
    if self.training and torch.is_grad_enabled():
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return forward(*args, **kwargs)


def is_checkpointed(module: nn.Module) -> bool:
    """Whether `apply_activation_checkpointing` wrapped this module."""
    return bool(module.__dict__.get(_MARK, False))


def apply_activation_checkpointing(model: nn.Module, module_types: list[str]) -> int:
    """Checkpoint the forward of every submodule whose class name is in `module_types`.

    Only the outermost match is wrapped (a checkpointed block inside a checkpointed block
    would be recomputed twice). Checkpointing applies in training mode with grad enabled;
    eval and no_grad calls run the plain forward. Idempotent. Returns the number of
    checkpointed modules. Unknown class names raise ConfigError listing the names present.
    """
    wanted = list(dict.fromkeys(module_types))
    if not wanted:
        return 0
    present = sorted({type(m).__name__ for m in model.modules()})
    unknown = [name for name in wanted if name not in present]
    if unknown:
        raise ConfigError(
            f"activation_checkpointing: no module of type {', '.join(map(repr, unknown))} in the "
            f"model; module types present: {', '.join(present)}. Name the repeated block class "
            "(e.g. a transformer block)"
        )
    count = 0
    covered: list[str] = []  # names of wrapped modules; their descendants are skipped
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in covered):
            continue
        if type(module).__name__ not in wanted:
            continue
        if module is model:
            raise ConfigError(
                f"activation_checkpointing: {type(model).__name__!r} is the model itself; "
                "checkpointing the whole model saves nothing. Name its repeated blocks instead"
            )
        if not is_checkpointed(module):
            # Instance attribute shadows the class's forward; nn.Module.__call__ picks it up
            # with hooks intact. A bound method survives copy.deepcopy (rebinds to the copy).
            module.forward = types.MethodType(_checkpointed_forward, module)
            module.__dict__[_MARK] = True
        covered.append(name)
        count += 1
    return count


def apply_channels_last(model: nn.Module) -> nn.Module:
    """Store the 4-D parameters and buffers (conv weights) in channels_last order, in place.
    Pair with `to_channels_last(batch)` on the inputs."""
    return model.to(memory_format=torch.channels_last)


def to_channels_last(batch: Any) -> Any:
    """Every 4-D tensor in `batch` (tensor, dict, list, tuple) as channels_last; the rest
    unchanged. Already channels_last tensors are returned without a copy."""
    if isinstance(batch, torch.Tensor):
        return batch.contiguous(memory_format=torch.channels_last) if batch.dim() == 4 else batch
    if isinstance(batch, Mapping):
        parts = {k: to_channels_last(v) for k, v in batch.items()}
        if type(batch) is dict:
            return parts
        try:
            return type(batch)(parts)
        except TypeError:
            return parts
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_channels_last(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_channels_last(v) for v in batch)
    return batch
