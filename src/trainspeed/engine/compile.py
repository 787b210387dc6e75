"""torch.compile as a switch that cannot take a run down.

    result = apply_compile(model, cfg.compile)
    model = result.module          # EagerFallback around the compiled module, or `model`

torch.compile is lazy: `torch.compile(model)` returns at once and the real work (tracing,
code generation, a C++/Triton toolchain) happens at the first call. So failures surface
inside the training step. `EagerFallback` catches them there: it switches to the eager
module for good, keeps the message in `.fallback_reason` (the Trainer emits it as a warning
event) and re-runs the call eagerly. It also times the first compiled call
(`first_call_seconds`, compile time included) so compile steps can be left out of throughput.

State dicts of the wrapper have exactly the eager model's keys (no `eager.` or `_orig_mod.`
prefix), in both directions, also when the wrapper is nested inside another module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainspeed.errors import ConfigError

__all__ = ["CompileResult", "EagerFallback", "apply_compile", "COMPILE_MODES"]

COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
_PREFIX = "eager."


@dataclass(kw_only=True, slots=True)
class CompileResult:
    """What `apply_compile` did."""

    module: nn.Module
    """The module to call in the training loop (the model itself when compile is off)."""
    enabled: bool
    """Whether torch.compile was applied (compilation itself happens at the first call)."""
    mode: str
    """The compile mode requested ("off" when disabled)."""
    notes: list[str] = field(default_factory=list)
    """Remarks for the run log."""


class EagerFallback(nn.Module):
    """Calls the compiled module; on an exception, falls back to the eager module for good.

    Exceptions that eager mode raises too (a wrong input shape, a bug in the model) are not
    compile failures: the wrapper then stays compiled and re-raises the eager error.
    Out-of-memory errors are re-raised untouched (running eagerly would not fix them, and
    the OOM handling of the caller needs to see them).

    Caveat: a failure inside the compiled *backward* happens in `loss.backward()`, outside
    this call, and cannot be caught here.
    """

    def __init__(self, eager: nn.Module, compiled: Callable[..., Any], *, mode: str = "default",
                 fallback_to_eager: bool = True) -> None:
        super().__init__()
        self.eager = eager  # registered: .to()/.train()/.parameters() reach the real weights
        # Not registered as a submodule: it holds the same parameters under `_orig_mod.`.
        object.__setattr__(self, "_compiled", compiled)
        self.mode = mode
        self.fallback_to_eager = fallback_to_eager
        self.fallback_reason: str | None = None
        """Why compilation was abandoned (None while the compiled module runs)."""
        self.first_call_seconds: float | None = None
        """Wall time of the first successful compiled call, which includes compilation."""
        self.compiled_calls = 0
        """Successful calls of the compiled module."""
        self.register_state_dict_post_hook(_strip_prefix)
        self.register_load_state_dict_pre_hook(_add_prefix)

    @property
    def compiled(self) -> Callable[..., Any] | None:
        """The compiled callable, or None after falling back to eager."""
        return self._compiled

    @property
    def is_compiled(self) -> bool:
        return self._compiled is not None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        compiled = self._compiled
        if compiled is None:
            return self.eager(*args, **kwargs)
        first = self.first_call_seconds is None
        # Host wall time only: on CUDA the kernels of this call may still be running, but the
        # first call is dominated by compilation, which is host work. No sync is added.
        t0 = time.perf_counter() if first else 0.0
        try:
            out = compiled(*args, **kwargs)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - any compiler failure is a reason to go eager
            if not self.fallback_to_eager:
                raise
            out = self.eager(*args, **kwargs)  # raises too -> not a compile failure; stay compiled
            object.__setattr__(self, "_compiled", None)
            message = " ".join(str(exc).split())[:500]
            self.fallback_reason = (
                f"torch.compile(mode={self.mode!r}) failed after {self.compiled_calls} compiled "
                f"call(s) with {type(exc).__name__}: {message}; continuing in eager mode"
            )
            return out
        if first:
            self.first_call_seconds = time.perf_counter() - t0
        self.compiled_calls += 1
        return out

    def train(self, mode: bool = True) -> EagerFallback:
        super().train(mode)
        compiled = self._compiled
        if isinstance(compiled, nn.Module):  # OptimizedModule keeps its own flag
            compiled.training = mode
        return self


def _strip_prefix(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """state_dict post-hook: '<prefix>eager.w' -> '<prefix>w' (keys keep their order)."""
    inner = prefix + _PREFIX
    for key in [k for k in state_dict if k.startswith(inner)]:
        # This module's keys are the last ones written, so re-inserting keeps their order.
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:  # module versions, keyed by module prefix without the trailing dot
        for key in [k for k in meta if k == inner[:-1] or k.startswith(inner)]:
            value = meta.pop(key)
            meta[prefix[:-1] if key == inner[:-1] else prefix + key[len(inner):]] = value


def _add_prefix(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: '<prefix>w' -> '<prefix>eager.w', so eager-model keys load."""
    inner = prefix + _PREFIX
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        mine = [k for k in meta if (k == prefix[:-1] or k.startswith(prefix)) and not k.startswith(inner)]
        for key in mine:
            if key == prefix[:-1]:  # the wrapper's own entry is the eager root's version
                meta[inner[:-1]] = meta[key]
            elif key != inner[:-1]:
                meta[inner + key[len(prefix):]] = meta.pop(key)


def apply_compile(model: nn.Module, cfg: Any, *,
                  compiler: Callable[..., Any] | None = None) -> CompileResult:
    """torch.compile `model` per `cfg` (mode, fullgraph, dynamic, fallback_to_eager).

    `compiler` replaces torch.compile (tests inject a failing one). Returns the model
    unchanged for mode "off".
    """
    mode = getattr(cfg, "mode", "off")
    if mode not in COMPILE_MODES:
        raise ConfigError(f"compile.mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    if mode == "off":
        return CompileResult(module=model, enabled=False, mode="off")
    fallback = bool(getattr(cfg, "fallback_to_eager", True))
    notes: list[str] = []
    if compiler is None:
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            reason = f"torch.compile is not supported in this environment (torch {torch.__version__})"
            if not fallback:
                raise ConfigError(f"compile.mode={mode!r}: {reason}; set compile.mode=off")
            return CompileResult(module=model, enabled=False, mode=mode, notes=[f"{reason}; running eager"])
        compiler = torch.compile
    device_types = {p.device.type for p in model.parameters()}
    if mode == "reduce-overhead" and device_types and "cuda" not in device_types:
        notes.append("compile.mode='reduce-overhead' adds CUDA graphs, which only apply on CUDA; "
                     "on this device it behaves like 'default'")
    try:
        compiled = compiler(model, mode=mode, fullgraph=bool(getattr(cfg, "fullgraph", False)),
                            dynamic=getattr(cfg, "dynamic", None))
    except Exception as exc:  # noqa: BLE001 - eager setup errors (bad option, unsupported backend)
        if not fallback:
            raise
        notes.append(f"torch.compile(mode={mode!r}) failed at setup with {type(exc).__name__}: "
                     f"{exc}; running eager")
        return CompileResult(module=model, enabled=False, mode=mode, notes=notes)
    wrapper = EagerFallback(model, compiled, mode=mode, fallback_to_eager=fallback)
    return CompileResult(module=wrapper, enabled=True, mode=mode, notes=notes)
