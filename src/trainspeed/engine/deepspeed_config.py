"""The DeepSpeed config a `distributed.strategy: deepspeed` run hands to `deepspeed.initialize`
(pure: a TrainConfig and the world size in, a dict out; no DeepSpeed import).

One setting, one owner. Batch size, accumulation, precision and gradient clipping are the
engine's switches (data.batch_size, accumulation.steps, precision.mode, optim.grad_clip), so the
tuner and the docs speak of one key each; the DeepSpeed config a user brings keeps everything
else (ZeRO stage, offload, buckets, communication settings). Where the two say different things
about the same setting, neither silently wins: a ConfigError names both values and the key to
change. ZeRO stage, overlap_comm and bucket size are DeepSpeed's own; distributed.zero_stage /
overlap_comm / bucket_size override them (how `trainspeed tune` tries other values without
editing the user's JSON).

The optimizer and its schedule are the engine's too (optim.*): a config with an `optimizer` or
`scheduler` section would build a second one, so it is refused with the keys to use instead.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

from trainspeed.errors import ConfigError

# DeepSpeed's own precision sections for each of the engine's modes (fp32 and tf32: neither).
_PRECISION_SECTION = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}
QUIET_STEPS = 10**9
"""steps_per_print when the config leaves it unset: DeepSpeed's per-N-steps log lines would
interleave with the engine's progress (the run directory has every step)."""


def read_deepspeed_config(spec: str | dict[str, Any] | None) -> dict[str, Any]:
    """distributed.deepspeed as a dict: a copy of the mapping, or the JSON file it names."""
    if spec is None:
        return {}
    if isinstance(spec, dict):
        return copy.deepcopy(spec)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(f"distributed.deepspeed: no such file {str(path)!r}; give the path of a "
                          "DeepSpeed config JSON (e.g. ds_config.json) or the mapping inline")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ConfigError(f"distributed.deepspeed: {path} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"distributed.deepspeed: {path} holds a {type(data).__name__}, not a "
                          "JSON object of DeepSpeed settings")
    return data


def _is_auto(value: Any) -> bool:
    """Hugging Face's DeepSpeed configs say "auto" for values the trainer fills in."""
    return value == "auto"


def _agree(ds: dict[str, Any], key: str, ours: Any, our_key: str, shown: str | None = None) -> None:
    """ds[key] = ours, unless the config already says something else (then a ConfigError)."""
    theirs = ds.get(key)
    if theirs is None or _is_auto(theirs):
        ds[key] = ours
        return
    if theirs != ours:
        raise ConfigError(
            f"the DeepSpeed config sets {key}={theirs!r} but {our_key}={shown or ours!r}: the two "
            f"disagree. Keep one: set {our_key}={theirs!r}, or remove {key} from the DeepSpeed "
            f"config (the engine fills it in from {our_key})")


def _precision(ds: dict[str, Any], mode: str, init_scale: float) -> None:
    want = _PRECISION_SECTION.get(mode)
    enabled = [name for name in ("bf16", "fp16")
               if isinstance(ds.get(name), dict) and ds[name].get("enabled") not in (False, "auto", None)]
    if enabled and enabled != [want]:
        theirs = {"bf16": "bf16-mixed", "fp16": "fp16-mixed"}[enabled[0]]
        raise ConfigError(
            f"the DeepSpeed config enables {enabled[0]} but precision.mode={mode!r}. Keep one: set "
            f"precision.mode={theirs} (DeepSpeed then runs {enabled[0]} and the engine's own "
            f"autocast stays off), or set {enabled[0]}.enabled=false in the DeepSpeed config")
    if want is not None:
        section = dict(ds.get(want) or {})
        section["enabled"] = True
        if want == "fp16":  # DeepSpeed's own dynamic loss scaler, starting where ours would
            section.setdefault("initial_scale_power", loss_scale_power(init_scale))
        ds[want] = section
    for name in ("bf16", "fp16"):
        if name != want and isinstance(ds.get(name), dict) and _is_auto(ds[name].get("enabled")):
            ds[name] = {**ds[name], "enabled": False}


def build_deepspeed_config(cfg: Any, world_size: int) -> dict[str, Any]:
    """The config for deepspeed.initialize: the user's DeepSpeed settings with the engine's
    batch, accumulation, precision, clipping and ZeRO overrides merged in (see the module
    docstring for who owns which key)."""
    d = cfg.distributed
    ds = read_deepspeed_config(d.deepspeed)
    for section, use in (("optimizer", "optim.name, optim.lr, optim.betas, optim.weight_decay"),
                         ("scheduler", "optim.schedule, optim.warmup_steps, optim.min_lr_ratio")):
        if section in ds:
            raise ConfigError(
                f"the DeepSpeed config has an {section!r} section, but the engine builds the "
                f"{section} itself from {use}; move its settings there and remove the section")
    micro, steps = cfg.data.batch_size, cfg.accumulation.steps
    _agree(ds, "train_micro_batch_size_per_gpu", micro, "data.batch_size")
    _agree(ds, "gradient_accumulation_steps", steps, "accumulation.steps")
    total = micro * steps * world_size
    theirs = ds.get("train_batch_size")
    if theirs not in (None, "auto") and theirs != total:
        raise ConfigError(
            f"the DeepSpeed config sets train_batch_size={theirs!r} but the engine trains "
            f"data.batch_size x accumulation.steps x ranks = {micro} x {steps} x {world_size} = {total} "
            f"samples per step. Keep one: remove train_batch_size from the DeepSpeed config (the engine "
            f"fills it in), or change data.batch_size / accumulation.steps so that their product with "
            f"the {world_size} rank(s) is {theirs!r}")
    ds["train_batch_size"] = total
    _precision(ds, cfg.precision.mode, cfg.precision.init_scale)
    clip = ds.get("gradient_clipping")
    if cfg.optim.grad_clip is None:
        if clip not in (None, 0, 0.0, "auto"):
            raise ConfigError(
                f"the DeepSpeed config sets gradient_clipping={clip!r} but optim.grad_clip is null "
                f"(no clipping). Keep one: set optim.grad_clip={clip!r}, or remove gradient_clipping")
        ds.pop("gradient_clipping", None)
    else:
        _agree(ds, "gradient_clipping", float(cfg.optim.grad_clip), "optim.grad_clip")
    zero = dict(ds.get("zero_optimization") or {})
    if d.zero_stage is not None:
        zero["stage"] = d.zero_stage
    if d.overlap_comm is not None:
        zero["overlap_comm"] = d.overlap_comm
    if d.bucket_size is not None:
        zero["reduce_bucket_size"] = zero["allgather_bucket_size"] = d.bucket_size
    zero.setdefault("stage", 0)
    if zero["stage"] not in (0, 1, 2, 3):
        raise ConfigError(f"the DeepSpeed config's zero_optimization.stage must be 0-3, got {zero['stage']!r}")
    ds["zero_optimization"] = zero
    ds.setdefault("steps_per_print", QUIET_STEPS)
    # The engine's AdamW/SGD are torch optimizers; DeepSpeed lets ZeRO wrap other optimizers
    # than its own only with this flag (torch's AdamW works with ZeRO; the check predates it).
    ds.setdefault("zero_allow_untested_optimizer", True)
    return ds


def zero_stage(ds: dict[str, Any]) -> int:
    return int((ds.get("zero_optimization") or {}).get("stage", 0))


def describe(ds: dict[str, Any], world_size: int) -> str:
    """One line for the run's notes: what DeepSpeed runs."""
    zero = ds.get("zero_optimization") or {}
    precision = next((name for name in ("bf16", "fp16") if (ds.get(name) or {}).get("enabled")), "fp32")
    offload = [what for what in ("offload_optimizer", "offload_param")
               if (zero.get(what) or {}).get("device") not in (None, "none")]
    parts = [f"DeepSpeed ZeRO stage {zero_stage(ds)}", precision, f"{world_size} rank(s)",
             f"micro-batch {ds['train_micro_batch_size_per_gpu']} x {ds['gradient_accumulation_steps']} accumulation"]
    if "overlap_comm" in zero:
        parts.append(f"overlap_comm={zero['overlap_comm']}")
    if offload:
        parts.append("offload: " + ", ".join(offload))
    return ", ".join(parts)


def loss_scale_power(init_scale: float) -> int:
    """precision.init_scale as DeepSpeed's fp16.initial_scale_power (2**power)."""
    return max(0, int(round(math.log2(init_scale))))
