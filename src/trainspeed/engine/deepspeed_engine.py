"""`distributed.strategy: deepspeed`: the Trainer's model, optimizer and step run by DeepSpeed's
engine (ZeRO 0-3, its bf16/fp16, its gradient reduction), everything else by the Trainer as
for DDP (data, logging, evaluation, checkpoints with keep-N, auto-resume and crash saves).

    torchrun --nproc_per_node 2 -m trainspeed train gpt distributed.strategy=deepspeed \\
        distributed.deepspeed=ds_config.json precision.mode=bf16-mixed

One process needs no launcher: the engine opens a one-rank gloo group itself (DeepSpeed needs a
process group even alone). The config handed to DeepSpeed is built in deepspeed_config.py.

The step (train_step): for each micro-batch, forward through the engine, then
`engine.backward(loss * weight, scale_wrt_gas=False)` with the engine's own micro-batch weights
(so accumulation.normalize=tokens stays exact), and the accumulation boundary set explicitly on
the last one (an epoch's short last group stays one optimizer step, as without DeepSpeed). ZeRO
reduces gradients inside backward (timed there); `engine.step()` at the boundary is the
optimizer phase (clipping, the update, zeroing the gradients).
"""

from __future__ import annotations

import os
import time
import typing
from typing import TYPE_CHECKING, Any

import torch

from trainspeed.engine.accumulation import micro_batch_weights
from trainspeed.engine.data.prefetch import move_to_device
from trainspeed.engine.events import Event
from trainspeed.errors import ConfigError
from trainspeed.telemetry.phase_context import phase_codes

if TYPE_CHECKING:
    from trainspeed.engine.trainer_view import TrainerView

_clock = time.perf_counter
_H2D, _H2D_END = phase_codes("h2d")
_FORWARD, _FORWARD_END = phase_codes("forward")
_BACKWARD, _BACKWARD_END = phase_codes("backward")
_OPTIMIZER, _OPTIMIZER_END = phase_codes("optimizer")

INSTALL_HINT = ("pip install setuptools wheel && pip install --no-build-isolation 'trainspeed[deepspeed]' "
                "(DeepSpeed's source build needs torch already installed)")


def import_deepspeed(device: torch.device) -> Any:
    """`import deepspeed`, on the CPU with DS_ACCELERATOR=cpu (set here unless the user chose);
    a clear error naming the install command when it is missing."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError as exc:
        raise ConfigError(f"distributed.strategy=deepspeed needs DeepSpeed, which is not installed "
                          f"({exc}). Install it: {INSTALL_HINT}") from exc
    return deepspeed


def check_compatible(cfg: Any) -> None:
    """Switches whose work DeepSpeed's engine does its own way: refused before any setup."""
    problems = []
    if cfg.compile.mode != "off":
        problems.append(f"compile.mode={cfg.compile.mode}: DeepSpeed's engine wraps the module and its "
                        "hooks are not traced by torch.compile here; set compile.mode=off")
    if cfg.batch.auto_microbatch:
        problems.append("batch.auto_microbatch=true: DeepSpeed fixes the micro-batch "
                        "(train_micro_batch_size_per_gpu); set data.batch_size instead")
    if cfg.nan_policy == "skip":
        problems.append("nan_policy=skip: DeepSpeed steps its optimizer inside engine.step() "
                        "(its fp16 loss scaler skips overflowing steps itself); use nan_policy=stop "
                        "or ignore")
    if problems:
        raise ConfigError("distributed.strategy=deepspeed: " + "; ".join(problems))


def one_process_env() -> list[str]:
    """Set the launcher variables a one-process run lacks (DeepSpeed opens, or joins, a process
    group even for one rank); returns the names set, for teardown to remove."""
    from trainspeed.engine.deepspeed_facts import one_process_env as missing

    added = missing(os.environ)
    os.environ.update(added)
    return list(added)


def start_engine(model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: Any, device: torch.device,
                 world_size: int) -> tuple[Any, dict[str, Any], list[str]]:
    """deepspeed.initialize on the eager module and the engine's own optimizer; returns
    (engine, the DeepSpeed config it runs, notes). The optimizer object stays the torch one the
    learning-rate schedule steps: ZeRO keeps it as its inner optimizer (its param_groups, and
    their lr, are the ones DeepSpeed's update reads)."""
    from trainspeed.engine.deepspeed_config import build_deepspeed_config, describe

    ds_config = build_deepspeed_config(cfg, world_size)
    deepspeed = import_deepspeed(device)
    try:
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config,
                                               dist_init_required=False)
    except (AssertionError, ValueError, KeyError, TypeError) as exc:  # DeepSpeed checks with assert
        raise ConfigError(f"DeepSpeed rejected the config built from distributed.deepspeed "
                          f"({type(exc).__name__}: {exc}). The config it was given: {ds_config}") from exc
    return engine, ds_config, [describe(ds_config, world_size)]


def train_step(trainer: TrainerView, group: list[tuple[Any, Any]], mon: Any) -> torch.Tensor:
    """One optimizer step through DeepSpeed's engine over the step's (batch, stats)
    micro-batches; returns the step's loss, still on the device."""
    engine, cfg, st = trainer._ds, trainer.cfg, trainer.state
    listening = trainer.callbacks.listening
    mark = mon.mark  # see Trainer._train_step
    weights = micro_batch_weights([s.tokens for _, s in group], cfg.accumulation.normalize) \
        if len(group) > 1 else [1.0]
    total: torch.Tensor | None = None
    last_index = len(group) - 1
    for i, (batch, _) in enumerate(group):
        if trainer._copy_batches:
            mark((_clock(), _H2D))
            try:
                batch = move_to_device(batch, trainer.device, cfg.data.non_blocking)
            finally:
                mark((_clock(), _H2D_END))
        # ZeRO reduces gradients in backward only at the boundary; say where it is rather than
        # let DeepSpeed count micro-steps (a short last group of an epoch is still one step).
        engine.set_gradient_accumulation_boundary(i == last_index)
        mark((_clock(), _FORWARD))
        try:
            loss = trainer._loss(engine, batch)
        finally:
            mark((_clock(), _FORWARD_END))
        if Event.AFTER_FORWARD in listening:
            trainer.callbacks.fire(Event.AFTER_FORWARD, st)
        weight = weights[i]
        mark((_clock(), _BACKWARD))
        try:
            engine.backward(loss if weight == 1.0 else loss * weight, scale_wrt_gas=False)
            if i != last_index:
                engine.step()  # off the boundary: counts the micro-step, updates nothing
        finally:
            mark((_clock(), _BACKWARD_END))
        if Event.AFTER_BACKWARD in listening:
            trainer.callbacks.fire(Event.AFTER_BACKWARD, st)
        part = loss.detach().float() if weight == 1.0 else loss.detach().float() * weight
        total = part if total is None else total + part
    mark((_clock(), _OPTIMIZER))
    try:
        engine.step()  # clipping, the (ZeRO-partitioned) update, zeroing the gradients
        if not trainer._lr_static:
            trainer.scheduler.step()
        if Event.OPTIMIZER_STEP in listening:
            trainer.callbacks.fire(Event.OPTIMIZER_STEP, st)
    finally:
        mark((_clock(), _OPTIMIZER_END))
    return typing.cast(torch.Tensor, total)  # the loop never trains an empty group


def forward_flops_x3(engine: Any, loss_fn: Any, batch: Any) -> int:
    """FLOPs of one training step as 3x the forward's (backward ~2x forward), counted without
    a backward: a backward outside engine.backward would fire ZeRO's gradient hooks."""
    from trainspeed.telemetry.flops import count_flops

    with torch.no_grad():
        return 3 * count_flops(lambda: loss_fn(engine, batch))
