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
(rank 0 of 1, a free local port) while the script runs, and says so.
"""

from __future__ import annotations

import os
import socket
import sys
from types import ModuleType
from typing import Any

import torch

from trainspeed.doctor.instrument.checkpoint import save_call
from trainspeed.doctor.instrument.imports import PostImportHooks
from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.sites import caller_site, format_site

LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
"""Set by a launcher (deepspeed, torchrun); without any, the script runs as one process."""
MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE", "SLURM_PROCID")
"""Set by mpirun/srun: DeepSpeed discovers the ranks itself there."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_process_env(environ: Any = os.environ) -> dict[str, str]:
    """The variables to add so that DeepSpeed initializes as rank 0 of 1 ({} when a launcher or
    MPI set the ranks, or they are there already)."""
    if any(k in environ for k in LAUNCHER_ENV) or any(k in environ for k in MPI_ENV):
        return {}
    add = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    if "MASTER_ADDR" not in environ:
        add["MASTER_ADDR"] = "127.0.0.1"
    if "MASTER_PORT" not in environ:
        add["MASTER_PORT"] = str(_free_port())
    return add


def _ask(engine: Any, name: str) -> Any:
    """engine.name() as a plain value, None when this DeepSpeed version lacks it."""
    try:
        value = getattr(engine, name)()
    except Exception:  # noqa: BLE001 - an observation, never a crash of the user's run
        return None
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return bool(value) if hasattr(value, "__bool__") else str(value)


def _offloaded(engine: Any, name: str) -> str | bool | None:
    """Where ZeRO offloads the optimizer or the parameters to ("cpu", "nvme"), False when it
    does not, None when unknown. Its config is an object with a device (an enum)."""
    try:
        value = getattr(engine, name)()
    except Exception:  # noqa: BLE001 - an observation, never a crash of the user's run
        return None
    device = getattr(value, "device", None)
    name = str(getattr(device, "value", device)).lower()
    return name if value is not None and name not in ("none", "") else False


def _param_count(engine: Any) -> int | None:
    """Parameters of the engine's module, whole: under ZeRO-3 each rank holds a partition and
    p.numel() is 0 outside a forward, p.ds_numel the full size."""
    try:
        return int(sum(getattr(p, "ds_numel", None) or p.numel() for p in engine.module.parameters()))
    except Exception:  # noqa: BLE001 - an observation, never a crash of the user's run
        return None


def device_memory(device: Any, environ: Any = os.environ) -> dict[str, Any]:
    """The memory a rank on `device` trains in: a CUDA device's total memory (one per rank),
    else the machine's RAM (psutil), shared by this node's LOCAL_WORLD_SIZE processes."""
    try:
        if isinstance(device, torch.device) and device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            return {"device_memory": int(props.total_memory), "device_memory_of": f"{props.name} memory",
                    "memory_shared_by": 1}
        import psutil

        return {"device_memory": int(psutil.virtual_memory().total), "device_memory_of": "machine RAM",
                "memory_shared_by": max(1, int(environ.get("LOCAL_WORLD_SIZE") or 1))}
    except Exception:  # noqa: BLE001 - an observation, never a crash of the user's run
        return {"device_memory": None}


def _autocast_dtype(engine: Any) -> str | None:
    """The dtype of DeepSpeed's own torch_autocast section, when it is on."""
    if not _ask(engine, "torch_autocast_enabled"):
        return None
    try:
        return str(engine.torch_autocast_dtype()).replace("torch.", "")
    except Exception:  # noqa: BLE001 - an older DeepSpeed
        return None


def describe_engine(engine: Any) -> dict[str, Any]:
    """The settings a finding reads, from the engine's parsed config (one call per run)."""
    config = getattr(engine, "config", None)
    info = {
        "class": type(engine).__name__,
        "zero_stage": _ask(engine, "zero_optimization_stage"),
        "bf16": _ask(engine, "bfloat16_enabled"),
        "fp16": _ask(engine, "fp16_enabled"),
        "torch_autocast": _ask(engine, "torch_autocast_enabled"),
        "torch_autocast_dtype": _autocast_dtype(engine),
        "overlap_comm": _ask(engine, "zero_overlap_comm"),
        "contiguous_gradients": _ask(engine, "zero_contiguous_gradients"),
        "offload_optimizer": _offloaded(engine, "zero_offload_optimizer"),
        "offload_param": _offloaded(engine, "zero_offload_param"),
        "train_batch_size": _ask(engine, "train_batch_size"),
        "micro_batch_size": _ask(engine, "train_micro_batch_size_per_gpu"),
        "accumulation_steps": _ask(engine, "gradient_accumulation_steps"),
        "dp_world_size": getattr(engine, "dp_world_size", None),
        "params": _param_count(engine),
        **device_memory(getattr(engine, "device", None)),
        "gradient_clipping": _ask(engine, "gradient_clipping"),
        "optimizer": type(getattr(engine, "optimizer", None)).__name__,
        "basic_optimizer": type(getattr(engine, "basic_optimizer", None)).__name__,
        "config": config if isinstance(config, str) else None,
        "version": getattr(sys.modules.get("deepspeed"), "__version__", None),
    }
    return info


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
                        bf16=_ask(engine, "bfloat16_enabled"), fp16=_ask(engine, "fp16_enabled"),
                        torch_autocast=_ask(engine, "torch_autocast_enabled"),
                        site=format_site(*where) if where else None)
    finally:
        session.internal -= 1


def install(session: Session, patches: Patches, imports: PostImportHooks) -> None:
    def on_deepspeed(module: ModuleType) -> None:
        if session.enabled:
            add = one_process_env()
            if add:
                for key, value in add.items():
                    patches.call_on_undo(lambda key=key: os.environ.pop(key, None))
                    os.environ[key] = value
                session.observe("deepspeed_launch", "deepspeed_launch", added_env=add)
                # not print(): logs.py would count the doctor's own note as the script's logging
                sys.stderr.write("trainspeed doctor: no launcher environment (RANK, WORLD_SIZE, LOCAL_RANK): "
                                 f"DeepSpeed runs as one process ({' '.join(f'{k}={v}' for k, v in add.items())})\n")
        engine_mod = sys.modules.get("deepspeed.runtime.engine")
        cls = getattr(engine_mod, "DeepSpeedEngine", None) if engine_mod is not None else None
        if isinstance(cls, type):
            _patch_engine(session, patches, cls)

    imports.add("deepspeed", on_deepspeed)


__all__ = ["describe_engine", "device_memory", "install", "one_process_env"]
