"""DeepSpeed hooks: an unchanged DeepSpeed script is diagnosed like any other loop.

DeepSpeed owns the step. `engine(x)` is the forward (the global module hooks see the
DeepSpeedEngine, an nn.Module, as the training module); `engine.backward(loss)` runs
`loss.backward()` and then ZeRO's gradient reduction (its epilogue runs after autograd
returns); `engine.step()` steps the torch optimizer underneath only at a gradient-accumulation
boundary, and under ZeRO once per parameter group (`_optimizer_step(group)`), so the torch
optimizer's hooks would count one step per group; `engine.save_checkpoint(dir)` writes a folder
of torch.save files (module, ZeRO partitions, optimizer state). So:

- `DeepSpeedEngine.backward` is the "backward" phase as a whole (reduction included); the
  loss it is given (the user's, before DeepSpeed divides it by the accumulation steps and
  scales it) is the step's loss, and the autograd backward inside is not a second one;
- `DeepSpeedEngine.step` is the "optimizer" phase; when it applied an update (`global_steps`
  moved) it closes one training step (boundary "engine"); the torch optimizer stepped inside
  closes nothing (optimizer.py);
- `save_checkpoint` is one checkpoint, whatever files it writes (checkpoint.save_call);
- the engine's settings (ZeRO stage, precision, batch sizes, overlap_comm...) are observed at
  its first step (observation kind "deepspeed"), a torch.autocast around the engine's forward
  as kind "deepspeed_autocast".

Call sites inside DeepSpeed are the user's line that called into it (sites.py), and the syncs
DeepSpeed's own step makes (overflow flags, gradient norms) are internals like Adam's.

Launch: `deepspeed.initialize` needs a launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT: `deepspeed`, `torchrun`) or mpi4py. A plain `python train.py` has
neither; for it the doctor sets the one-process environment the `deepspeed` launcher would
(rank 0 of 1, a free local port) while the script runs, and says so (launch_env.py).
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

import torch

from trainspeed.doctor.instrument.checkpoint import save_call
from trainspeed.doctor.instrument.imports import PostImportHooks
from trainspeed.doctor.instrument.launch_env import set_one_process_env
from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.sites import caller_site, format_site
from trainspeed.engine.deepspeed_facts import ask, describe_engine, device_memory, one_process_env


def _patch_engine(session: Session, patches: Patches, cls: type) -> None:
    def make_backward(original: Any) -> Any:
        def backward(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
            s = session
            if s.bwd_depth or not s.on():
                return original(self, loss, *args, **kwargs)
            s.close_eval()
            s.bwd_depth = 1  # the autograd backward inside is this one (autograd.py)
            s.on_backward(loss)
            s.mon.begin("backward")
            try:
                return original(self, loss, *args, **kwargs)
            finally:
                s.bwd_depth = 0
                s.mon.end("backward")

        backward.__wrapped__ = original  # type: ignore[attr-defined]
        return backward

    def make_step(original: Any) -> Any:
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            s = session
            if s.engine_depth or not s.on():
                return original(self, *args, **kwargs)
            s.close_eval()
            if s.boundary in (None, "backward", "optimizer"):
                # from now on the engine closes steps: a forward after ZeRO cleared the
                # gradients (p.grad is None) is not a step boundary
                s.boundary = "engine"
            key = f"deepspeed:{id(self)}"
            if key not in s.observations and len(s.observations) < 256:
                s.internal += 1
                try:
                    s.observe(key, "deepspeed", **describe_engine(self))
                finally:
                    s.internal -= 1
            before = getattr(self, "global_steps", None)
            s.engine_depth += 1
            s.mon.begin("optimizer")
            try:
                result = original(self, *args, **kwargs)
            finally:
                s.engine_depth -= 1
                s.mon.end("optimizer")
            if before is None or getattr(self, "global_steps", None) != before:
                s.end_engine_step(getattr(self, "optimizer", None))  # may raise StopDoctor
            return result

        step.__wrapped__ = original  # type: ignore[attr-defined]
        return step

    def make_forward(original: Any) -> Any:
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            s = session
            if s.on() and "deepspeed_autocast" not in s.observations:
                _observe_autocast(s, self)
            return original(self, *args, **kwargs)

        forward.__wrapped__ = original  # type: ignore[attr-defined]
        return forward

    def checkpoint_dir(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        save_dir = args[1] if len(args) > 1 else kwargs.get("save_dir")
        tag = args[2] if len(args) > 2 else kwargs.get("tag")
        if tag is None and args and getattr(args[0], "global_steps", None) is not None:
            tag = f"global_step{args[0].global_steps}"  # DeepSpeed's own default tag: the folder it wrote
        return os.path.join(os.fspath(save_dir), str(tag)) if tag is not None else os.fspath(save_dir)

    patches.wrap(cls, "backward", make_backward)
    patches.wrap(cls, "step", make_step)
    patches.wrap(cls, "forward", make_forward)
    patches.wrap(cls, "save_checkpoint",
                 lambda orig: save_call(session, "deepspeed.save_checkpoint", orig, checkpoint_dir))


def _observe_autocast(session: Session, engine: Any) -> None:
    """torch.autocast switched on around a DeepSpeed engine whose config runs bf16/fp16 itself."""
    try:
        device = getattr(engine, "device", None)
        device_type = device.type if isinstance(device, torch.device) else str(device or "cpu").split(":")[0]
        if not torch.is_autocast_enabled(device_type):
            return
        dtype = str(torch.get_autocast_dtype(device_type)).replace("torch.", "")
    except (TypeError, RuntimeError, AttributeError):
        return
    session.internal += 1
    try:
        where = caller_site(2)  # the user's `engine(x)`
        session.observe("deepspeed_autocast", "deepspeed_autocast", device=device_type, dtype=dtype,
                        bf16=ask(engine, "bfloat16_enabled"), fp16=ask(engine, "fp16_enabled"),
                        torch_autocast=ask(engine, "torch_autocast_enabled"),
                        site=format_site(*where) if where else None)
    finally:
        session.internal -= 1


def _patch_initialize(session: Session, patches: Patches, module: ModuleType) -> None:
    """Where the script calls deepspeed.initialize, and how it gives the config: a file path
    ("file"), a dict built in the code ("dict"), or only args (its --deepspeed_config). A config
    built in the code has no file to name in advice: the call site is where it is edited."""
    def make_initialize(original: Any) -> Any:
        def initialize(*args: Any, **kwargs: Any) -> Any:
            s = session
            if s.on() and "deepspeed_initialize" not in s.observations:
                s.internal += 1
                try:
                    where = caller_site(1)
                    config = kwargs.get("config", kwargs.get("config_params"))
                    given = ("file" if isinstance(config, (str, os.PathLike)) else "dict" if isinstance(config, dict)
                             else "args" if kwargs.get("args") is not None or args else None)
                    s.observe("deepspeed_initialize", "deepspeed_initialize", config=given,
                              site=format_site(*where) if where else None)
                finally:
                    s.internal -= 1
            return original(*args, **kwargs)

        initialize.__wrapped__ = original  # type: ignore[attr-defined]
        return initialize

    patches.wrap(module, "initialize", make_initialize)


def install(session: Session, patches: Patches, imports: PostImportHooks) -> None:
    def on_deepspeed(module: ModuleType) -> None:
        _patch_initialize(session, patches, module)
        if session.enabled:
            set_one_process_env(session, patches, "DeepSpeed")
        engine_mod = sys.modules.get("deepspeed.runtime.engine")
        cls = getattr(engine_mod, "DeepSpeedEngine", None) if engine_mod is not None else None
        if isinstance(cls, type):
            _patch_engine(session, patches, cls)

    imports.add("deepspeed", on_deepspeed)


__all__ = ["describe_engine", "device_memory", "install", "one_process_env"]
