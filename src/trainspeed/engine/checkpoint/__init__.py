"""Checkpointing and fault tolerance: atomic verified files, async saves, retention, resume,
emergency saves on SIGTERM/Ctrl-C, and an optional mirror to a second location.

The Trainer uses CheckpointSession (session.py), which wires all of the below. By hand:

    manager = CheckpointManager.from_config(cfg.checkpoint, run_dir, on_event=route_to_monitor)
    if manager.should_save(step):
        manager.save(build_checkpoint(model, opt, sched, scaler, counters, ...), step, metrics)
    ...
    path = manager.resolve_resume(cfg.checkpoint.resume, auto_resume=cfg.checkpoint.auto_resume)
    if path: counters = restore_checkpoint(manager.load(path), model, opt, sched, scaler)
"""

from __future__ import annotations

from trainspeed.engine.checkpoint.async_save import AsyncSaver, to_host
from trainspeed.engine.checkpoint.atomic import (
    atomic_save,
    cleanup_stale_temps,
    load_verified,
    manifest_path,
    verify,
)
from trainspeed.engine.checkpoint.emergency import EmergencySaver, is_oom
from trainspeed.engine.checkpoint.manager import (
    CheckpointInfo,
    CheckpointManager,
    SaveResult,
    find_resumable,
    list_checkpoints,
)
from trainspeed.engine.checkpoint.session import CheckpointSession, Resumed
from trainspeed.engine.checkpoint.state import (
    TrainState,
    build_checkpoint,
    capture_rng,
    load_model_state,
    restore_checkpoint,
    restore_rng,
    unwrap_model,
)

__all__ = [
    "AsyncSaver",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointSession",
    "EmergencySaver",
    "Resumed",
    "SaveResult",
    "TrainState",
    "atomic_save",
    "build_checkpoint",
    "capture_rng",
    "cleanup_stale_temps",
    "find_resumable",
    "is_oom",
    "list_checkpoints",
    "load_model_state",
    "load_verified",
    "manifest_path",
    "restore_checkpoint",
    "restore_rng",
    "to_host",
    "unwrap_model",
    "verify",
]
