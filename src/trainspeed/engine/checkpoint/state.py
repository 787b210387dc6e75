"""What a checkpoint holds, and putting it back: model, optimizer, scheduler, scaler, counters, RNG.

Everything stored is a tensor or a plain container of ints/floats/strings, so the file loads
under `torch.load(weights_only=True)`. Wrapped models are handled transparently: a
`torch.compile`d model (`_orig_mod.` keys) or a DDP/DataParallel one (`module.` keys) saves the
same keys as the bare model, and a checkpoint written from any of them loads into any other.
"""

from __future__ import annotations

import hashlib
import json
import platform
import random
import time
import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any

from trainspeed.errors import CheckpointError, TrainspeedWarning

FORMAT = "trainspeed-checkpoint"
FORMAT_VERSION = 1
_WRAPPER_SEGMENTS = ("_orig_mod",)
_SHOW = 8  # how many keys an error message lists before "... and N more"


# ----------------------------------------------------------------------------- RNG


def capture_rng() -> dict[str, Any]:
    """Python, NumPy, torch CPU and (when available) every CUDA device's RNG state."""
    import numpy as np
    import torch

    version, internal, gauss_next = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [int(version), list(internal), gauss_next],
        "numpy": {
            "name": str(np_name),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64).copy()),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": [],
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of capture_rng. CUDA states are restored for min(saved, present) devices."""
    import numpy as np
    import torch

    try:
        version, internal, gauss_next = state["python"]
        random.setstate((int(version), tuple(int(x) for x in internal), gauss_next))
        npst = state["numpy"]
        keys = npst["keys"]
        keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
        np.random.set_state(
            (npst["name"], keys.astype(np.uint32), int(npst["pos"]), int(npst["has_gauss"]),
             float(npst["cached_gaussian"]))
        )
        torch.set_rng_state(state["torch"].cpu())
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint RNG state is malformed: {exc!r}") from exc
    cuda_states = state.get("cuda") or []
    if cuda_states and torch.cuda.is_available():
        n = min(len(cuda_states), torch.cuda.device_count())
        if n < len(cuda_states):
            warnings.warn(
                f"checkpoint holds RNG state for {len(cuda_states)} CUDA devices but "
                f"{torch.cuda.device_count()} are visible; restored the first {n}",
                TrainspeedWarning, stacklevel=2,
            )
        for i in range(n):
            torch.cuda.set_rng_state(cuda_states[i].cpu(), device=i)


# ----------------------------------------------------------------------------- counters


@dataclass(kw_only=True, slots=True)
class TrainState:
    """Progress counters that, with the RNG and sampler state, pin down where training is."""

    step: int = 0
    """Optimizer steps completed."""
    epoch: int = 0
    """Current epoch (0-based)."""
    samples: int = 0
    """Training samples consumed so far."""
    tokens: int = 0
    """Training tokens consumed so far (0 when the workload has no tokens)."""
    batch_in_epoch: int = 0
    """Batches of the current epoch already consumed (where to resume the data stream)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise CheckpointError(f"TrainState.{f.name} must be an int >= 0, got {value!r}")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainState:
        known = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in d.items() if k in known})


# ----------------------------------------------------------------------------- model keys


def unwrap_model(model: Any) -> Any:
    """Peel torch.compile (`_orig_mod`) and DDP/DataParallel/FSDP-style (`.module`) wrappers."""
    import torch

    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    for _ in range(16):
        if hasattr(model, "_orig_mod") and isinstance(model._orig_mod, torch.nn.Module):
            model = model._orig_mod
        elif isinstance(model, wrappers):
            model = model.module
        else:
            return model
    return model


def _normalize_key(key: str) -> str:
    # A compiled submodule puts `_orig_mod` in the middle of keys: `block._orig_mod.weight`.
    return ".".join(p for p in key.split(".") if p not in _WRAPPER_SEGMENTS)


def normalize_state_dict(sd: dict[str, Any], *, strip_module: bool = True) -> dict[str, Any]:
    """Drop `_orig_mod` segments and (when every key has it) a leading `module.` prefix."""
    out = {_normalize_key(k): v for k, v in sd.items()}
    if strip_module:
        while out and all(k.startswith("module.") for k in out):
            out = {k[len("module."):]: v for k, v in out.items()}
    return out


def model_state_dict(model: Any) -> dict[str, Any]:
    """The model's state dict with the keys of the bare, unwrapped model."""
    return normalize_state_dict(unwrap_model(model).state_dict(), strip_module=False)


def _listing(keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOW])
    return shown + (f", ... and {len(keys) - _SHOW} more" if len(keys) > _SHOW else "")


def load_model_state(model: Any, sd: dict[str, Any]) -> None:
    """Load `sd` into `model` strictly, or raise CheckpointError naming every mismatch."""
    import torch

    target = unwrap_model(model)
    own = target.state_dict()
    by_norm = {_normalize_key(k): k for k in own}
    strip = not all(k.startswith("module.") for k in by_norm)
    ckpt = normalize_state_dict(sd, strip_module=strip)
    missing = sorted(k for k in by_norm if k not in ckpt)
    unexpected = sorted(k for k in ckpt if k not in by_norm)
    shapes = []
    for k in sorted(set(by_norm) & set(ckpt)):
        a, b = ckpt[k], own[by_norm[k]]
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape != b.shape:
            shapes.append(f"{k}: checkpoint {tuple(a.shape)} vs model {tuple(b.shape)}")
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing in checkpoint ({len(missing)}): {_listing(missing)}")
        if unexpected:
            parts.append(f"unexpected in checkpoint ({len(unexpected)}): {_listing(unexpected)}")
        if shapes:
            parts.append(f"shape mismatches ({len(shapes)}): {_listing(shapes)}")
        raise CheckpointError(
            "checkpoint does not fit the model (was it saved from a different architecture or "
            "config?): " + "; ".join(parts)
        )
    target.load_state_dict({by_norm[k]: v for k, v in ckpt.items()}, strict=True)


# ----------------------------------------------------------------------------- build / restore


def config_hash(config: dict[str, Any] | None) -> str | None:
    """sha256 of the canonical JSON of a config dict (first 16 hex digits)."""
    if config is None:
        return None
    canon = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def _plain(obj: Any) -> Any:
    """A JSON round trip: leaves only types weights_only loading accepts."""
    return json.loads(json.dumps(obj, default=str))


def build_checkpoint(
    model: Any,
    optimizer: Any = None,
    scheduler: Any = None,
    scaler: Any = None,
    counters: TrainState | dict[str, int] | None = None,
    sampler_state: dict[str, Any] | None = None,
    config_dict: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    *,
    config_digest: str | None = None,
) -> dict[str, Any]:
    """Everything needed to continue training exactly where it stopped, as one dict.

    `config_digest` overrides the hash of `config_dict` (pass trainspeed.config.config_hash(cfg),
    which ignores the run name, so a resumed run under a new name compares equal).

    The dict references live tensors (no copies); hand it to CheckpointManager.save, which
    copies to host memory (async) or writes it (sync) before training mutates them again.
    """
    import torch

    import trainspeed

    if isinstance(counters, TrainState):
        counters = counters.to_dict()
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        # None: saved elsewhere (a sharded checkpoint keeps model and optimizer in DCP shards)
        "model": model_state_dict(model) if model is not None else None,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "counters": dict(counters or {}),
        "sampler": sampler_state,
        "rng": capture_rng(),
        "config": _plain(config_dict) if config_dict is not None else None,
        "config_hash": config_digest if config_digest is not None else config_hash(config_dict),
        "versions": {
            "trainspeed": str(trainspeed.__version__),
            "torch": str(torch.__version__),  # a TorchVersion object would not load weights_only
            "python": platform.python_version(),
        },
        "extra": extra or {},
        "t_wall": time.time(),
    }


def _check_format(ckpt: Any) -> None:
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        keys = list(ckpt)[:_SHOW] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(
            f"not a trainspeed checkpoint (top-level keys: {keys}); a bare model state dict "
            "can be loaded with load_model_state(model, state_dict)"
        )
    if int(ckpt.get("format_version", 1)) > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint format version {ckpt['format_version']} is newer than this trainspeed "
            f"reads ({FORMAT_VERSION}); upgrade trainspeed"
        )


def _group_sizes(sd: dict[str, Any]) -> list[int]:
    return [len(g.get("params", [])) for g in sd.get("param_groups", [])]


def check_optimizer_state(optimizer: Any, sd: dict[str, Any] | None) -> None:
    """Raise CheckpointError when `sd` cannot be loaded into `optimizer` (group count/sizes)."""
    if sd is None:
        raise CheckpointError(
            "checkpoint has no optimizer state; pass optimizer=None to load the weights only"
        )
    mine, theirs = _group_sizes(optimizer.state_dict()), _group_sizes(sd)
    if mine != theirs:
        raise CheckpointError(
            f"optimizer does not fit the checkpoint: the optimizer has {len(mine)} param "
            f"group(s) with sizes {mine}, the checkpoint has {len(theirs)} with sizes {theirs}"
        )


def load_optimizer_state(optimizer: Any, sd: dict[str, Any] | None) -> None:
    check_optimizer_state(optimizer, sd)
    try:
        optimizer.load_state_dict(sd)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"optimizer state does not fit ({type(optimizer).__name__}): {exc}") from exc


def check_scheduler_state(scheduler: Any, sd: dict[str, Any] | None) -> None:
    if sd is None:
        raise CheckpointError("checkpoint has no scheduler state; pass scheduler=None to skip it")
    mine = scheduler.state_dict()
    if "base_lrs" in mine and "base_lrs" in sd and len(mine["base_lrs"]) != len(sd["base_lrs"]):
        raise CheckpointError(
            f"scheduler does not fit the checkpoint: it drives {len(mine['base_lrs'])} param "
            f"group(s), the checkpoint's drove {len(sd['base_lrs'])}"
        )


def load_scheduler_state(scheduler: Any, sd: dict[str, Any] | None) -> None:
    check_scheduler_state(scheduler, sd)
    try:
        scheduler.load_state_dict(sd)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"scheduler state does not fit ({type(scheduler).__name__}): {exc}") from exc


def load_scaler_state(scaler: Any, sd: dict[str, Any] | None) -> None:
    if sd is None:
        raise CheckpointError("checkpoint has no GradScaler state; pass scaler=None to skip it")
    if not sd:  # saved from a disabled scaler: nothing to restore
        return
    try:
        scaler.load_state_dict(sd)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"GradScaler state does not fit: {exc}") from exc


def restore_checkpoint(
    ckpt: dict[str, Any],
    model: Any,
    optimizer: Any = None,
    scheduler: Any = None,
    scaler: Any = None,
    *,
    rng: bool = True,
) -> TrainState:
    """Put a checkpoint back into live objects; returns the counters.

    Parts passed as None are skipped (model=None: the model was loaded another way, e.g. from
    a sharded checkpoint's DCP shards). Structure is checked before anything is loaded, and
    every mismatch is a CheckpointError naming the keys/shapes/groups involved.
    The sampler state is `ckpt["sampler"]` (the data layer restores it).
    """
    _check_format(ckpt)
    # Cheap structural checks first, so a mismatch leaves the live objects untouched.
    if optimizer is not None:
        check_optimizer_state(optimizer, ckpt.get("optimizer"))
    if scheduler is not None:
        check_scheduler_state(scheduler, ckpt.get("scheduler"))
    if scaler is not None and ckpt.get("scaler") is None:
        raise CheckpointError("checkpoint has no GradScaler state; pass scaler=None to skip it")
    if model is not None:
        load_model_state(model, ckpt["model"])
    if optimizer is not None:
        load_optimizer_state(optimizer, ckpt.get("optimizer"))
    if scheduler is not None:
        load_scheduler_state(scheduler, ckpt.get("scheduler"))
    if scaler is not None:
        load_scaler_state(scaler, ckpt.get("scaler"))
    if rng and ckpt.get("rng") is not None:
        restore_rng(ckpt["rng"])
    return TrainState.from_dict(ckpt.get("counters") or {})
