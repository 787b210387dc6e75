"""What the engine knows about its own run, written as the observation events the checks read.

The doctor observes a foreign script's DataLoaders and device from outside; the Trainer built
them, so it states them (same event shape: `observation` with a `kind`). Without them a Trainer
run that waits for data was diagnosed as a script building batches in its loop ("no
DataLoader"), with advice to write one, where the fix is the engine's `data.num_workers`.
Written once, at the start of fit(); nothing per step.
"""

from __future__ import annotations

from typing import Any

import torch

from trainspeed.config import TrainConfig
from trainspeed.telemetry.cuda_facts import cuda_device_facts
from trainspeed.telemetry.loader_facts import available_cores, loader_facts


def emit_observations(mon: Any, loaders: Any, parts: Any, cfg: TrainConfig, device: Any, model: Any,
                      ds_engine: Any = None) -> None:
    """The training (and validation) loader and the device, as `observation` events of `mon`.
    A DataLoader passed to the Trainer (`parts`: DataParts) is used as is, so "built_by" user.
    The model's class and parameter count go in a `model` event (`trainspeed report --compare`
    warns when two runs trained different models; not an observation: the doctor's model
    checks read those, for a foreign script's module). Under distributed.strategy=deepspeed the
    engine's settings too (kind "deepspeed", as the doctor observes a script's engine)."""
    cores = available_cores()
    # one pass, at setup; under ZeRO-3 a parameter holds a partition and ds_numel its whole size
    params = sum(getattr(p, "ds_numel", None) or p.numel() for p in model.parameters())
    mon.event("model", name=type(model).__name__, params=int(params))

    def facts(loader: Any, given: Any, role: str) -> dict[str, Any]:
        return loader_facts(loader, role, built_by="user" if loader is given else "engine", cores=cores)

    mon.event("observation", kind="dataloader", **facts(loaders.train, parts.train, "train"))
    if loaders.val is not None:
        mon.event("observation", kind="dataloader", **facts(loaders.val, parts.val, "eval"))
    device_type = getattr(device, "type", str(device))
    facts = cuda_device_facts() if device_type == "cuda" else {}
    mon.event("observation", kind="device", type=device_type, cores=cores, engine=True,
              precision=cfg.precision.mode, float32_matmul_precision=torch.get_float32_matmul_precision(), **facts)
    if device_type == "cuda":
        # The model and batch as the doctor observes a script's, so a recipe run gets the same
        # GPU checks (fp32 on tensor cores, launch-bound steps): written on CUDA only, where
        # those checks apply (a CPU run's findings stay as they were).
        for kind, fields in model_facts(model, cfg):
            mon.event("observation", kind=kind, **fields)
    if ds_engine is not None:  # the settings the DeepSpeed checks read, as the doctor records them
        from trainspeed.engine.deepspeed_facts import describe_engine, engine_precision

        info = describe_engine(ds_engine)
        mon.event("observation", kind="deepspeed", **info, trainspeed_engine=True)
        precision = engine_precision(info)
        if precision is not None:  # the DeepSpeed config's, where run_start has precision.mode's
            mon.event("precision", precision=precision, source="deepspeed config")


def model_facts(model: Any, cfg: TrainConfig) -> list[tuple[str, dict[str, Any]]]:
    """(kind, fields) of the `model` and `batch` observations of an engine run: the parameters'
    dtype, the precision the config runs it in (autocast), whether it is compiled."""
    dtypes: dict[str, int] = {}
    for p in model.parameters():
        name = str(p.dtype).replace("torch.", "")
        dtypes[name] = dtypes.get(name, 0) + p.numel()
    mode = cfg.precision.mode
    autocast = {"bf16-mixed": "bfloat16", "fp16-mixed": "float16"}.get(mode)
    return [("model", {"class": type(model).__name__, "params": sum(dtypes.values()),
                       "param_dtype": max(dtypes, key=dtypes.get) if dtypes else None,  # type: ignore[arg-type]
                       "device": "cuda", "compiled": cfg.compile.mode != "off", "autocast": autocast,
                       "data_parallel": False, "engine": True}),
            ("batch", {"batch_size": cfg.data.batch_size})]


__all__ = ["emit_observations", "model_facts"]
