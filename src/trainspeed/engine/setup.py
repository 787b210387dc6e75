"""Builds what the Trainer's loop needs from a TrainConfig: device, seeds, model switches,
optimizer, scheduler, precision, data loaders. Each switch is a plain function from its own
module; this file only wires them together in the right order.
"""

from __future__ import annotations

import os
import random
import re
import sys
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


def run_dir_for(cfg: TrainConfig, say: Callable[[str], None] | None = None) -> Path:
    """The run's directory. A new run never lands in one that holds another run's records or
    checkpoints: a second `run.name=o2` without a resume trained from step 1 into o2, appended to
    its steps.jsonl (steps 149, 150, 1, 2 ...), and a later --auto-resume took the old run's step
    150 checkpoint and pruned the new run's. With --auto-resume and the derived, timestamped name
    (config.py), the newest run of the same target under run.out_dir is the one continued:
    `trainspeed train my.yaml --auto-resume`, as documented, started afresh every time."""
    from trainspeed.config import recipe_label

    restarted = _restarted_job_run(cfg, say or _say)
    if restarted is not None:
        return restarted
    label = recipe_label(cfg.recipe.name)
    path = Path(cfg.run.out_dir) / (cfg.run.name or f"{label}-{time.strftime('%Y%m%d-%H%M%S')}")
    held = _held(path, cfg.checkpoint.dir)
    if (cfg.checkpoint.auto_resume and not cfg.checkpoint.resume and not cfg.checkpoint.dir
            and _stamped(path.name, label) and not held):
        earlier = _newest_run(Path(cfg.run.out_dir), label)
        if earlier is not None:
            cfg.run.name = earlier.name  # the dumped config names the directory it continues
            (say or _say)(f"--auto-resume: continuing {earlier}, the newest run of {label} there "
                          "(run.name=NAME picks another)")
            return earlier
        (say or _say)(f"--auto-resume: no earlier run of {label} under {cfg.run.out_dir} to continue: "
                      "starting a new one")
    if held and not (cfg.checkpoint.resume or cfg.checkpoint.auto_resume):
        where = cfg.checkpoint.dir if held.startswith("checkpoints") and cfg.checkpoint.dir else path
        raise ConfigError(f"{where} already holds a run ({held}): continue it with --auto-resume (or "
                          "checkpoint.auto_resume=true), or give this run another run.name"
                          f"{' and checkpoint.dir' if cfg.checkpoint.dir else ''}; nothing was written")
    return path


def _restarted_job_run(cfg: TrainConfig, say: Callable[[str], None]) -> Path | None:
    """SLURM started this job again (requeued after SIGUSR1's save, or by SLURM itself): the run
    the job began, as its env.json names the job, continues from its newest checkpoint, whether
    or not the job's command says --auto-resume (engine/checkpoint/slurm.py). None: no such run
    with a checkpoint, a first start, or a run the config names otherwise."""
    from trainspeed.config import recipe_label
    from trainspeed.engine.checkpoint import slurm

    job = slurm.job_id()
    if job is None or slurm.restart_count() == 0 or cfg.checkpoint.resume:
        return None
    earlier = slurm.run_of_job(Path(cfg.run.out_dir), job)
    named = cfg.run.name and not _stamped(cfg.run.name, recipe_label(cfg.recipe.name))  # not derived
    if earlier is None or (named and cfg.run.name != earlier.name):
        return None
    if _held(earlier, cfg.checkpoint.dir, steps=False) is None:  # its checkpoints, or none
        return None  # stopped before its first save: nothing to continue from
    cfg.run.name, cfg.checkpoint.auto_resume = earlier.name, True
    say(f"SLURM started job {job} again (restart {slurm.restart_count()}): continuing its run {earlier} "
        "from its newest checkpoint")
    return earlier


_STAMPED = re.compile(r"-\d{8}-\d{6}$")


def _stamped(name: str, label: str) -> bool:
    """`LABEL-YYYYmmdd-HHMMSS`: the run name config.py derives for a target."""
    return name.startswith(label + "-") and len(name) == len(label) + 16 and bool(_STAMPED.search(name))


def _held(path: Path, checkpoint_dir: str | None, steps: bool = True) -> str | None:
    """What of an earlier run `path` holds (its checkpoints, its step records), or None."""
    from trainspeed.engine.checkpoint.listing import list_checkpoints

    saved = list_checkpoints(Path(checkpoint_dir) if checkpoint_dir else path / "checkpoints")
    if saved:
        return f"checkpoints up to step {saved[-1].step}"
    try:
        if steps and (path / "steps.jsonl").stat().st_size > 0:
            return "step records in steps.jsonl"
    except OSError:
        pass
    return None


def _newest_run(out_dir: Path, label: str) -> Path | None:
    """The most recently named `LABEL-YYYYmmdd-HHMMSS` run under out_dir that holds checkpoints."""
    try:
        names = sorted((p for p in out_dir.iterdir() if p.is_dir() and _stamped(p.name, label)), reverse=True)
    except OSError:
        return None
    return next((path for path in names if _held(path, None, steps=False)), None)


def _say(text: str) -> None:
    print(f"trainspeed: {text}", file=sys.stderr, flush=True)


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
