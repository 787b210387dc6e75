"""`TrainerView`: the Trainer's parts that its helpers (events' TrainerState, evaluation,
trainer_checkpoints, deepspeed_engine) read, as a Protocol. Its own module, importing nothing
of the engine, so that those helpers name the Trainer's type without importing trainer.py,
which imports them. At run time the object is always the Trainer itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol


class TrainerView(Protocol):
    cfg: Any  # TrainConfig
    state: Any  # events.TrainerState
    callbacks: Any  # events.CallbackList
    device: Any  # torch.device
    dist: Any  # distributed.Dist
    rank: int
    world_size: int
    run_dir: Path
    data: Any  # setup.DataParts
    eager: Any  # the model, unwrapped
    optimizer: Any
    scheduler: Any
    precision: Any
    ds_config: Any
    eval_metrics: Callable[[Any, Any], dict[str, float]] | None
    _ds: Any  # DeepSpeed's engine, or None
    _fsdp_state: Any
    _ckpt_session: Any
    _resume_target: Any  # checkpoint.restore.ResumeTarget, or None
    _ckpt_group: Any
    _agree_group: Any
    _ckpt_tag: Any
    _lr_static: bool
    _copy_batches: bool

    def _loss(self, model: Any, batch: Any) -> Any: ...


__all__ = ["TrainerView"]
