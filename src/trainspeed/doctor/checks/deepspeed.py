"""DeepSpeed findings: what the engine's own config and the loop around it show.

The doctor observes each DeepSpeedEngine at its first step (observation "deepspeed": ZeRO
stage, bf16/fp16, overlap_comm, contiguous_gradients, batch sizes, data-parallel size) and a
torch.autocast around the engine's forward ("deepspeed_autocast"); see
doctor/instrument/deepspeed.py.
"""

from __future__ import annotations

from typing import Any

from trainspeed.doctor.checks.context import CheckContext, pct
from trainspeed.doctor.findings import Finding


def engine(ctx: CheckContext) -> dict[str, Any] | None:
    """The first DeepSpeed engine's settings, when the script used one."""
    return ctx.first("deepspeed")


def config_name(ctx: CheckContext, info: dict[str, Any]) -> str:
    """How to name the engine's config in advice: its file (as given to deepspeed.initialize,
    or the script's --deepspeed_config), else "the DeepSpeed config"."""
    path = info.get("config")
    if not (isinstance(path, str) and path):
        for obs in ctx.obs("script_flags"):
            for row in obs.get("flags") or []:
                if isinstance(row, dict) and row.get("dest") in ("deepspeed_config", "deepscale_config"):
                    path = row.get("value") if isinstance(row.get("value"), str) else path
    return f"the DeepSpeed config ({path})" if isinstance(path, str) and path else "the DeepSpeed config"


def engine_precision(info: dict[str, Any]) -> str | None:
    """The precision an engine trains in, from its observed config: "bf16"/"fp16" (its bf16 or
    fp16 section: half-precision weights, an fp32 master copy in the optimizer),
    "bf16-mixed"/"fp16-mixed" (its torch_autocast section: fp32 weights, autocast matmuls), None
    in fp32."""
    if info.get("bf16") or info.get("fp16"):
        return "bf16" if info.get("bf16") else "fp16"
    if info.get("torch_autocast"):
        return "fp16-mixed" if info.get("torch_autocast_dtype") == "float16" else "bf16-mixed"
    return None


def autocast_in_engine(ctx: CheckContext) -> Finding | None:
    """torch.autocast around a bf16/fp16 engine: precision is handled twice. The engine's config
    already keeps the weights in half precision (and its optimizer the fp32 master copy); on
    CUDA DeepSpeed switches autocast off inside the engine (with a warning), so the autocast
    does nothing, and on other devices it adds casts (fp32 ops under autocast) to a half model."""
    seen = ctx.first("deepspeed_autocast")
    if not seen:
        return None
    precision = engine_precision(seen)
    if precision is None or seen.get("torch_autocast"):
        return None  # an fp32 engine under autocast, or DeepSpeed's own torch_autocast section
    info = engine(ctx) or {}
    where = f" around the engine's forward at {seen['site']}" if seen.get("site") else " around the engine's forward"
    return Finding(
        id="deepspeed_autocast",
        severity="warning",
        title=f"torch.autocast wraps a DeepSpeed engine that already runs in {precision}",
        evidence=(f"torch.autocast({seen.get('device')}, {seen.get('dtype')}) is on{where}, while "
                  f"{config_name(ctx, info)} enables {precision} ({precision}.enabled): the weights are {precision} "
                  "already and the optimizer keeps the fp32 master copy, so precision is handled twice "
                  "(on CUDA DeepSpeed turns autocast off inside the engine and logs a warning; elsewhere "
                  "autocast adds casts to a half-precision model)"),
        recommendation=(f"remove the torch.autocast around the engine call and let {precision}.enabled do mixed "
                        "precision; to train with autocast instead (fp32 weights), drop the "
                        f"{precision} section and enable DeepSpeed's torch_autocast section"),
        verify_with=ctx.doctor_command() + " (after the change)",
        impact=0.0,
    )


def zero2_overlap(ctx: CheckContext) -> Finding | None:
    """ZeRO-2 across processes with overlap_comm or contiguous_gradients off: the gradient
    reduction does not overlap the backward, or copies gradients into scattered buffers."""
    info = engine(ctx)
    if not info or info.get("zero_stage") != 2:
        return None
    off = [key for key in ("overlap_comm", "contiguous_gradients") if info.get(key) is False]
    world = info.get("dp_world_size")
    if not off or not isinstance(world, int) or world < 2:
        return None  # one process reduces nothing: the settings change no time here
    share = ctx.share("backward")
    settings = ", ".join(f'"{key}": true' for key in off)
    return Finding(
        id="deepspeed_zero2_overlap",
        severity="warning",
        title=f"ZeRO-2 with {' and '.join(off)} off",
        evidence=(f"{config_name(ctx, info)} runs ZeRO stage 2 on {world} data-parallel processes with "
                  f"{', '.join(f'{key}=false' for key in off)}; the backward (which includes ZeRO's gradient "
                  f"reduction) takes {pct(share)} of step time"),
        recommendation=(f"set {settings} in zero_optimization: overlap_comm reduces gradient buckets while the "
                        "backward still runs; contiguous_gradients copies them into one buffer as they are "
                        "produced (less fragmentation, faster reduction)"),
        verify_with=ctx.doctor_command() + " (after the change: the backward share should drop)",
        impact=0.0,
    )


def batch_mismatch(ctx: CheckContext) -> Finding | None:
    """The loop's batches or backward passes per update disagree with the engine's config: the
    config's train_batch_size (what DeepSpeed counts samples, throughput and sample-based
    schedules by) is not what the loop trains on."""
    info = engine(ctx)
    if not info or not ctx.steps:
        return None
    micro, accum = info.get("micro_batch_size"), info.get("accumulation_steps")
    batch = (ctx.first("batch") or {}).get("batch_size")
    factor = (ctx.first("accumulation") or {}).get("factor")
    problems = []
    if isinstance(micro, int) and isinstance(batch, int) and batch != micro:
        problems.append(f"each backward sees {batch} samples, while train_micro_batch_size_per_gpu is {micro}")
    if isinstance(accum, int) and isinstance(factor, int) and factor != accum:
        problems.append(f"each update follows {factor} engine.backward calls, while gradient_accumulation_steps "
                        f"is {accum}")
    if not problems:
        return None
    world = info.get("dp_world_size") or 1
    real = (batch if isinstance(batch, int) else micro or 0) * (factor if isinstance(factor, int) else accum or 1)
    return Finding(
        id="deepspeed_batch_mismatch",
        severity="warning",
        title="The training loop disagrees with the DeepSpeed config's batch",
        evidence=(f"{'; '.join(problems)} ({config_name(ctx, info)}: train_batch_size={info.get('train_batch_size')} "
                  f"over {world} process{'es' if world != 1 else ''}; the loop trains on {real * world} samples "
                  "per update)"),
        recommendation=("build the DataLoader with batch_size=engine.train_micro_batch_size_per_gpu() and call "
                        "engine.backward(loss) and engine.step() once per micro-batch (DeepSpeed applies the "
                        "update every gradient_accumulation_steps); or change the config to what the loop does, "
                        "so learning-rate schedules and DeepSpeed's samples/s count the real batch"),
        verify_with=ctx.doctor_command() + " (after the change)",
        impact=0.0,
    )


CHECKS = (autocast_in_engine, zero2_overlap, batch_mismatch)
