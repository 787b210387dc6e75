"""Numeric precision as one object: autocast region, loss scaling, optimizer step.

    prec = setup_precision(cfg.precision, device)
    with prec.autocast():
        loss = loss_fn(model, batch)
    prec.backward(loss)
    prec.unscale_(optimizer)            # only before gradient clipping
    skipped = prec.step(optimizer)      # device bool tensor with a scaler, else False

Modes: "fp32" (nothing), "tf32" (TF32 tensor-core matmuls on Ampere+ CUDA; process-global
flags, undone by `restore()`), "bf16-mixed" and "fp16-mixed" (autocast). fp16 needs a
GradScaler: its gradients underflow to zero without loss scaling. On a CPU without bf16/fp16
units the mixed modes run through emulation, usually far slower than fp32; `notes` says so.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainspeed.errors import ConfigError

__all__ = ["Precision", "setup_precision", "cpu_flags", "MODES"]

MODES = ("fp32", "tf32", "bf16-mixed", "fp16-mixed")
_AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


_NO_AUTOCAST = contextlib.nullcontext()  # reusable and stateless: one instance for every step


@dataclass(kw_only=True, slots=True)
class Precision:
    """The resolved precision of a run. Build it with `setup_precision`."""

    mode: str
    """One of MODES."""
    dtype: torch.dtype | None = None
    """Autocast dtype (bf16/fp16), or None for fp32/tf32."""
    device_type: str = "cpu"
    """Device type autocast and the scaler run on ("cuda", "cpu", ...)."""
    scaler: Any = None
    """torch.amp.GradScaler, or None when no loss scaling runs."""
    notes: list[str] = field(default_factory=list)
    """Human-readable remarks for the run log (e.g. "bf16 on this CPU is emulated")."""
    _saved_flags: dict[str, Any] | None = None
    _skipped: torch.Tensor | None = None

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward-pass region: torch.autocast for mixed modes, a no-op otherwise."""
        if self.dtype is None:
            return _NO_AUTOCAST
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor, *, retain_graph: bool = False) -> None:
        """loss.backward(), on the scaled loss when a scaler runs."""
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(retain_graph=retain_graph)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the loss scale in place, so clipping sees true norms.
        At most once per optimizer step, before `step`; a no-op without a scaler."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | bool:
        """Run the optimizer step; return whether it was skipped for inf/nan gradients.

        Without a scaler: optimizer.step() and False. With one: scaler.step + update, and a
        0-d bool tensor on the scaler's device, True when the scale went down, i.e. the step
        found inf/nan gradients and was skipped. The comparison adds no CPU-GPU sync (bool()
        on the result is one: read it at the log interval, or use `skipped_total()`).
        """
        if self.scaler is None:
            optimizer.step()
            return False
        before = self.scaler._scale  # noqa: SLF001 - public get_scale() is a host sync
        before = before.clone() if before is not None else None
        self.scaler.step(optimizer)
        self.scaler.update()
        after = self.scaler._scale  # noqa: SLF001
        if before is None or after is None:  # scaler disabled or never scaled a loss
            return False
        # update() multiplies the scale by backoff_factor (< 1) exactly when inf/nan was found.
        skipped = after < before
        self._skipped = skipped.to(torch.int64) if self._skipped is None else self._skipped + skipped
        return skipped

    def skipped_total(self) -> int:
        """Steps skipped for inf/nan gradients so far. CPU-GPU sync point: call at log time."""
        return 0 if self._skipped is None else int(self._skipped.item())

    def loss_scale(self) -> torch.Tensor | None:
        """The current loss scale as a device tensor (no sync), or None without a scaler."""
        return None if self.scaler is None else self.scaler._scale  # noqa: SLF001

    def state_dict(self) -> dict[str, Any]:
        """Scaler state for checkpoints ({} without a scaler)."""
        return {} if self.scaler is None else {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def restore(self) -> None:
        """Undo the process-global matmul flags set for tf32 (safe to call more than once)."""
        saved = self._saved_flags
        if not saved:
            return
        # set_float32_matmul_precision also writes allow_tf32, so it goes first.
        torch.set_float32_matmul_precision(saved["float32_matmul_precision"])
        torch.backends.cuda.matmul.allow_tf32 = saved["cuda_matmul_allow_tf32"]
        torch.backends.cudnn.allow_tf32 = saved["cudnn_allow_tf32"]
        self._saved_flags = None


def cpu_flags(path: str | Path = "/proc/cpuinfo") -> set[str] | None:
    """The CPU feature flags from /proc/cpuinfo, or None where that file does not exist."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86 / ARM spelling
            return set(value.split())
    return set()


def _device_type(device: Any) -> str:
    try:
        return torch.device(device).type
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"precision: cannot read a device from {device!r} ({exc})") from exc


def _cpu_notes(mode: str, flags: set[str] | None) -> list[str]:
    if mode == "bf16-mixed":
        if flags is None:
            return ["bf16-mixed on CPU: could not read the CPU flags; without native bf16 "
                    "units (avx512_bf16/amx_bf16) it is emulated and likely slower than fp32"]
        native = sorted(flags & {"avx512_bf16", "amx_bf16", "bf16"})  # "bf16": ARMv8.6 spelling
        if native:
            return [f"bf16-mixed on CPU: native bf16 support found ({', '.join(native)})"]
        return ["bf16-mixed on CPU: this CPU has no bf16 units (no avx512_bf16/amx_bf16 flag), "
                "so bf16 matmuls are emulated and will likely be much slower than fp32; "
                "measure with `trainspeed tune` or use precision.mode=fp32"]
    if mode == "fp16-mixed":
        native = sorted((flags or set()) & {"amx_fp16", "avx512_fp16"})
        if native:
            return [f"fp16-mixed on CPU: native fp16 support found ({', '.join(native)})"]
        return ["fp16-mixed on CPU: allowed, but this CPU has no fp16 matmul units "
                "(no amx_fp16/avx512_fp16 flag), so it will likely be slower than fp32; "
                "bf16-mixed needs no loss scaling and is the usual choice on CPU"]
    if mode == "tf32":
        return ["tf32 changes CUDA matmuls only (Ampere or newer); on CPU this run is fp32"]
    return []


def _cuda_notes(mode: str, device: Any) -> list[str]:
    if not torch.cuda.is_available():
        return []
    major, _ = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    if mode == "tf32" and major < 8:
        return [f"tf32 needs an Ampere or newer GPU; {name} runs these matmuls in fp32"]
    if mode == "bf16-mixed" and not torch.cuda.is_bf16_supported(including_emulation=False):
        return [f"bf16-mixed: {name} has no bf16 tensor cores; bf16 is emulated and slow, "
                "use precision.mode=fp16-mixed on this GPU"]
    return []


def setup_precision(cfg: Any, device: Any, *, flags: set[str] | None = None) -> Precision:
    """Resolve `cfg` (mode, grad_scaler, init_scale) for `device` into a Precision.

    `flags` overrides the CPU feature flags (tests); by default /proc/cpuinfo is read.
    tf32 sets process-global flags; call `Precision.restore()` to undo them.
    """
    mode = getattr(cfg, "mode", "fp32")
    if mode not in MODES:
        raise ConfigError(f"precision.mode must be one of {', '.join(MODES)}, got {mode!r}")
    want_scaler = getattr(cfg, "grad_scaler", "auto")
    if want_scaler not in ("auto", True, False):
        raise ConfigError(f"precision.grad_scaler must be 'auto', true or false, got {want_scaler!r}")
    use_scaler = (mode == "fp16-mixed") if want_scaler == "auto" else bool(want_scaler)
    if mode == "fp16-mixed" and not use_scaler:
        raise ConfigError(
            "precision.grad_scaler=false with precision.mode='fp16-mixed': fp16 gradients "
            "underflow to zero without loss scaling, so training silently stalls. "
            "Use precision.grad_scaler=auto, or precision.mode='bf16-mixed' (no scaler needed)"
        )
    init_scale = float(getattr(cfg, "init_scale", 2.0**16))
    if not init_scale > 0:
        raise ConfigError(f"precision.init_scale must be > 0, got {init_scale}")
    device_type = _device_type(device)

    notes: list[str] = []
    if device_type == "cpu":
        notes += _cpu_notes(mode, cpu_flags() if flags is None else flags)
    elif device_type == "cuda":
        notes += _cuda_notes(mode, device)
    if use_scaler and mode != "fp16-mixed":
        notes.append(f"grad_scaler=true with precision.mode={mode!r}: loss scaling is only "
                     "needed for fp16 and costs a host sync per step here")

    prec = Precision(mode=mode, dtype=_AUTOCAST_DTYPES.get(mode), device_type=device_type, notes=notes)
    if use_scaler:
        prec.scaler = torch.amp.GradScaler(device_type, init_scale=init_scale)
    if mode == "tf32":
        prec._saved_flags = {
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        }
        torch.set_float32_matmul_precision("high")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return prec
