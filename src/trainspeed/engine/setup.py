"""Builds what the Trainer's loop needs from a TrainConfig: device, seeds, model switches,
optimizer, scheduler, precision, data loaders. Each switch is a plain function from its own
module; this file only wires them together in the right order.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from trainspeed.config import TrainConfig
from trainspeed.errors import ConfigError


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"run.device is {spec!r} but CUDA is not available on this machine "
            f"(torch {torch.__version__}). Use run.device=auto or run.device=cpu."
        )
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_dir_for(cfg: TrainConfig) -> Path:
    name = cfg.run.name or f"{cfg.recipe.name or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.run.out_dir) / name


@dataclass
class DataParts:
    """The user's or recipe's data, before loaders are built."""

    train: Any
    val: Any = None
    collate_fn: Callable | None = None
    batch_stats: Callable[[Any], Any] | None = None
    lengths: Sequence[int] | None = None


@dataclass
class Loaders:
    train: Any
    train_sampler: Any = None
    train_bundle: Any = None  # LoaderBundle: advance()/state_dict() for exact resume
    val: Any = None
    notes: list[str] = field(default_factory=list)


def build_loaders(parts: DataParts, cfg: TrainConfig, device: torch.device,
                  rank: int = 0, world_size: int = 1) -> Loaders:
    """A DataLoader passed in by the user is used as is (their tuning wins); a Dataset gets a
    loader built from `cfg.data` (workers, pinning, padding, bucketing, resumable order)."""
    from torch.utils.data import DataLoader

    from trainspeed.engine.data.loader import build_dataloader

    notes: list[str] = []
    bundle = None
    if isinstance(parts.train, DataLoader):
        train, sampler = parts.train, None
    else:
        bundle = build_dataloader(parts.train, cfg.data, collate_fn=parts.collate_fn,
                                  lengths=parts.lengths, device=str(device), seed=cfg.run.seed,
                                  rank=rank, world_size=world_size, train=True)
        train, sampler = bundle.loader, bundle.sampler
        notes += list(getattr(bundle, "notes", []) or [])
    val = None
    if parts.val is not None:
        if isinstance(parts.val, DataLoader):
            val = parts.val
        else:
            val = build_dataloader(parts.val, cfg.data, collate_fn=parts.collate_fn,
                                   lengths=None, device=str(device), seed=cfg.run.seed,
                                   rank=rank, world_size=world_size, train=False).loader
    return Loaders(train=train, train_sampler=sampler, train_bundle=bundle, val=val, notes=notes)


@dataclass
class ModelParts:
    model: nn.Module  # what the loop calls (maybe compiled / wrapped)
    eager: nn.Module  # the plain module (state dicts, FLOP counting, eval)
    notes: list[str] = field(default_factory=list)
    compiled: bool = False


def prepare_model(model: nn.Module, cfg: TrainConfig, device: torch.device) -> ModelParts:
    """Move to device and apply the model switches in the order that composes correctly:
    channels_last and activation checkpointing on the eager module, compile last."""
    from trainspeed.engine.compile import apply_compile
    from trainspeed.engine.memory_opts import apply_activation_checkpointing, apply_channels_last

    notes: list[str] = []
    model = model.to(device)
    if cfg.channels_last:
        model = apply_channels_last(model)
    if cfg.activation_checkpointing:
        count = apply_activation_checkpointing(model, list(cfg.activation_checkpointing))
        notes.append(f"activation checkpointing on {count} modules")
    result = apply_compile(model, cfg.compile)
    notes += list(result.notes or [])
    return ModelParts(model=result.module, eager=model, notes=notes, compiled=result.enabled)


def set_threads(cfg: TrainConfig) -> None:
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)


def world() -> tuple[int, int]:
    """(rank, world_size) from torchrun's environment; (0, 1) when not distributed."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
