"""Findings about how the script uses the device: precision, optimizer implementation,
DataParallel, compilation, GPU utilization, memory headroom, gradient accumulation."""

from __future__ import annotations

from typing import Any

from trainspeed.doctor.checks.context import CheckContext, pct
from trainspeed.doctor.checks.script_flags import flag_note, script_flag, set_flag, show_flag
from trainspeed.doctor.findings import Finding
from trainspeed.telemetry.throughput import COMPUTE_BOUND_MFU

TENSOR_CORE_CAPABILITY = 7.0
"""Volta (sm_70) and newer have tensor cores: fp16/bf16 matmuls run several times faster than
fp32 (NVIDIA "Train with Mixed Precision" guide; PyTorch AMP recipe)."""
FP32_IMPACT = 0.4
"""Estimated share of step time at stake when matmuls run in fp32 on tensor-core GPUs (the
AMP recipe reports 1.5-3x; we claim the low end and say: measure with the tuner)."""
FUSED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad", "Adamax", "NAdam", "RAdam", "RMSprop", "Adadelta")
"""torch.optim classes with foreach/fused implementations."""
OPTIMIZER_SHARE_NOTICE = 0.05
"""Optimizer step above 5 % of step time makes its implementation worth a look."""
DATA_PARALLEL_IMPACT = 0.25
"""nn.DataParallel replicates the model and scatters inputs from one Python thread every step;
PyTorch docs recommend DistributedDataParallel even on a single machine."""
GPU_UTIL_WARNING = 0.5
"""The GPU busy less than half the time (NVML utilization) means it waits on the host."""
SMALL_BATCH = 16
"""Batches this small rarely fill a GPU; with low MFU the step is launch-bound."""
LOW_MFU = 0.05
NEAR_OOM = 0.95
"""Reserved memory above 95 % of the device: the next longer batch can OOM, and the caching
allocator starts freeing and retrying (cudaMalloc retries), which is slow."""
HEADROOM = 0.30
"""Peak allocation below 30 % of the device: a larger batch (or less accumulation) would use
the GPU better."""


def _capability(ctx: CheckContext) -> float | None:
    device = ctx.first("device") or {}
    cap = device.get("capability")
    try:
        return float(cap) if cap is not None else None
    except (TypeError, ValueError):
        return None


def _autocast_used(ctx: CheckContext) -> bool:
    precision = str(ctx.summary.get("precision") or "fp32")
    return precision != "fp32" or any(m.get("autocast") for m in ctx.models())


def fp32_on_tensor_cores(ctx: CheckContext) -> Finding | None:
    cap = _capability(ctx)
    if ctx.device_type != "cuda" or cap is None or cap < TENSOR_CORE_CAPABILITY:
        return None
    models = ctx.models()
    if not models or _autocast_used(ctx):
        return None
    if any(m.get("param_dtype") not in ("float32", None) for m in models):
        return None
    device = ctx.first("device") or {}
    bf16 = bool(device.get("bf16_supported"))
    tf32 = ""
    if cap >= 8.0 and device.get("float32_matmul_precision") == "highest" and not device.get("tf32_matmul"):
        tf32 = "; TF32 is off too: torch.set_float32_matmul_precision('high') alone speeds up fp32 matmuls"
    dtype = "bfloat16" if bf16 else "float16 (with torch.amp.GradScaler)"
    return Finding(
        id="fp32_on_tensor_cores",
        severity="warning",
        title="Training in fp32 on a GPU with tensor cores",
        evidence=f"{device.get('name', 'GPU')} (sm_{cap:.1f}), parameters float32, no autocast{tf32}",
        recommendation=(f"run forward/backward under torch.autocast('cuda', dtype=torch.{dtype.split()[0]}) "
                        f"(engine: precision.mode={'bf16' if bf16 else 'fp16'}-mixed)"),
        verify_with=ctx.tune_command("precision"),
        impact=FP32_IMPACT,
    )


def optimizer_not_fused(ctx: CheckContext) -> Finding | None:
    opt = ctx.primary_optimizer()
    if ctx.device_type != "cuda" or not opt or opt.get("class") not in FUSED_OPTIMIZERS:
        return None
    if opt.get("fused"):
        return None
    share = ctx.share("optimizer")
    forced_loop = opt.get("foreach") is False
    if not forced_loop and share < OPTIMIZER_SHARE_NOTICE:
        return None
    return Finding(
        id="optimizer_not_fused",
        severity="warning" if forced_loop and share >= OPTIMIZER_SHARE_NOTICE else "info",
        title=f"{ctx.optimizer_label(opt)} runs {'a per-parameter loop' if forced_loop else 'without fused kernels'}",
        evidence=(f"{opt['class']}(fused={opt.get('fused')}, foreach={opt.get('foreach')}) over "
                  f"{opt.get('params')} parameters; the optimizer step is {pct(share)} of step time"),
        recommendation=f"{opt['class']}(..., fused=True) (engine: optim.implementation=fused)",
        verify_with=ctx.tune_command("fused"),
        impact=share * (0.6 if forced_loop else 0.3),
    )


def data_parallel(ctx: CheckContext) -> Finding | None:
    if not any(m.get("data_parallel") for m in ctx.models()):
        return None
    return Finding(
        id="data_parallel",
        severity="warning",
        title="nn.DataParallel instead of DistributedDataParallel",
        evidence="the model is wrapped in torch.nn.DataParallel (single-process, multi-thread replication)",
        recommendation=("use DistributedDataParallel, one process per GPU: torchrun --nproc_per_node=N train.py "
                        "(engine: distributed.strategy=ddp)"),
        impact=DATA_PARALLEL_IMPACT,
    )


def not_compiled(ctx: CheckContext) -> Finding | None:
    models = ctx.models()
    if not models or any(m.get("compiled") for m in models):
        return None
    framework = (ctx.first("framework") or {}).get("name", "plain")
    flag = script_flag(ctx, "compile")
    how = (f"{set_flag(flag, True)} (the script's flag, now {show_flag(flag)})" if flag
           else "engine.compile() after deepspeed.initialize" if ctx.first("deepspeed")
           else "model = torch.compile(model)")
    return Finding(
        id="not_compiled",
        severity="info",
        title="The model is not compiled",
        evidence=(f"{', '.join(str(m.get('class')) for m in models[:3])} run{'s' if len(models) == 1 else ''} "
                  f"eagerly ({framework} loop); torch.compile fuses elementwise ops"
                  f"{flag_note(ctx, 'compile')}"),
        recommendation=f"{how} (engine: compile.mode=default); measure it, gains vary",
        verify_with=ctx.tune_command("compile"),
        impact=0.0,
    )


def _gpu_util(ctx: CheckContext) -> float | None:
    for event in ctx.run.events_of("system"):
        data: dict[str, Any] = event.get("data") or {}
        for key in ("gpu_util_mean", "gpu_util", "gpu_utilization"):
            value = data.get(key)
            if isinstance(value, (int, float)):
                return float(value) / 100.0 if value > 1.0 else float(value)
    return None


def low_gpu_utilization(ctx: CheckContext) -> Finding | None:
    if ctx.device_type != "cuda":
        return None
    util = _gpu_util(ctx)
    batch = ctx.first("batch") or {}
    size = batch.get("batch_size")
    mfu = (ctx.summary.get("mfu") or {})
    mfu_value = mfu.get("value") if mfu.get("valid") else None
    small = isinstance(size, int) and size <= SMALL_BATCH and mfu_value is not None and mfu_value < LOW_MFU
    if (util is None or util >= GPU_UTIL_WARNING) and not small:
        return None
    parts = []
    if util is not None:
        parts.append(f"GPU busy {pct(util)} of the time")
    if mfu_value is not None:
        parts.append(f"MFU {pct(mfu_value)}")
    if size is not None:
        parts.append(f"batch size {size}")
    return Finding(
        id="low_gpu_utilization",
        severity="warning" if util is not None and util < GPU_UTIL_WARNING else "info",
        title="The GPU is mostly idle" if util is not None and util < GPU_UTIL_WARNING else "Small batches leave the GPU underused",
        evidence=", ".join(parts),
        recommendation=("find what the GPU waits for (the data, log and sync findings above); a bigger batch "
                        "(`trainspeed tune --knobs batch_size` finds the fastest) or CUDA graphs (engine: compile.mode=reduce-overhead) "
                        "amortize launch overhead"),
        verify_with=ctx.tune_command("batch_size"),
        impact=(1.0 - util) if util is not None else 0.1,
    )


def compute_bound(ctx: CheckContext) -> Finding | None:
    """Not a problem, an answer: at half the peak or more, the usual overhead fixes have
    little to win, and the user should know that before trying them one by one."""
    mfu = ctx.summary.get("mfu") or {}
    value = mfu.get("value") if mfu.get("valid") else None
    if value is None or value < COMPUTE_BOUND_MFU:
        return None
    compute = ctx.share("forward") + ctx.share("backward") + ctx.share("optimizer")
    cpu = ctx.run.env.get("cpu") if isinstance(ctx.run.env, dict) else None
    no_bf16 = ctx.device_type == "cpu" and isinstance(cpu, dict) and cpu.get("bf16_fast") is False
    suggest_bf16 = not _autocast_used(ctx)  # already in bf16/fp16: nothing to add
    helps = []
    if suggest_bf16 and not no_bf16:
        helps.append("lower precision where the device has units for it (engine: precision.mode=bf16-mixed)")
    if not any(m.get("compiled") for m in ctx.models()):
        helps.append("torch.compile, fusing the elementwise ops between the matmuls (engine: compile.mode=default)")
    helps.append("a faster device")
    tail = "; this CPU has no bf16 units, so bf16 autocast would be emulated and slower" if suggest_bf16 and no_bf16 else ""
    return Finding(
        id="compute_bound",
        severity="info",
        title=f"The step is compute-bound: {pct(value)} of the device's peak",
        evidence=(f"MFU {pct(value)} of {mfu.get('peak_name') or 'the peak'}; forward, backward and "
                  f"optimizer take {pct(compute)} of the step"),
        recommendation=("overhead fixes (data loading, logging, host syncs) have little left to win here. "
                        f"What can still help: {', or '.join(helps)}{tail}"),
        verify_with=ctx.tune_command("compile") if no_bf16 else ctx.tune_command("precision", "compile"),
        impact=0.0,
    )


def _memory_fraction(ctx: CheckContext) -> tuple[float | None, float | None, float | None]:
    device = ctx.first("device") or {}
    total = device.get("total_memory")
    mem = ctx.summary.get("memory") or {}
    if not isinstance(total, (int, float)) or total <= 0:
        return None, None, mem.get("cuda_alloc_retries")
    alloc = mem.get("cuda_alloc_peak")
    reserved = mem.get("cuda_reserved_peak")
    return (alloc / total if isinstance(alloc, (int, float)) else None,
            reserved / total if isinstance(reserved, (int, float)) else None,
            mem.get("cuda_alloc_retries"))


def memory_pressure(ctx: CheckContext) -> Finding | None:
    if ctx.device_type != "cuda":
        return None
    alloc, reserved, retries = _memory_fraction(ctx)
    if isinstance(retries, (int, float)) and retries > 0 or (reserved is not None and reserved >= NEAR_OOM):
        return Finding(
            id="memory_near_oom",
            severity="warning",
            title="GPU memory is nearly full",
            evidence=(f"peak reserved {pct(reserved)} of device memory, peak allocated {pct(alloc)}, "
                      f"allocator retries {retries}"),
            recommendation=("lower the batch size or activation memory (engine: activation_checkpointing=[Block], "
                            "precision.mode=bf16-mixed, batch.auto_microbatch=true) and set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
            impact=0.05 if retries else 0.0,
        )
    if alloc is not None and alloc < HEADROOM:
        return Finding(
            id="memory_headroom",
            severity="info",
            title="Most GPU memory is unused",
            evidence=f"peak allocated {pct(alloc)} of device memory",
            recommendation="a larger batch may raise throughput; measure it (trainspeed tune --knobs batch_size)",
            verify_with=ctx.tune_command("batch_size"),
            impact=0.0,
        )
    return None


def accumulation_for_speed(ctx: CheckContext) -> Finding | None:
    acc = ctx.first("accumulation") or {}
    factor = acc.get("factor")
    if not isinstance(factor, int) or factor <= 1:
        return None
    alloc, _, _ = _memory_fraction(ctx)
    if ctx.device_type == "cuda" and (alloc is None or alloc >= 0.5):
        return None  # accumulation is plausibly needed for memory
    room = f"peak allocation {pct(alloc)} of device memory" if alloc is not None else f"training on {ctx.device_type}"
    ds = ctx.first("deepspeed") or {}
    micro = ds.get("micro_batch_size")
    change = (f"in the DeepSpeed config: gradient_accumulation_steps=1, train_micro_batch_size_per_gpu="
              f"{micro * factor if isinstance(micro, int) else f'<{factor}x>'}" if ds
              else f"engine: accumulation.steps=1 data.batch_size=<{factor}x>")
    return Finding(
        id="accumulation_for_speed",
        severity="info",
        title=f"Gradient accumulation over {factor} micro-batches without memory pressure",
        evidence=f"{factor} backward passes on new inputs (micro-batches) per update of {_primary(ctx)}; {room}",
        recommendation=("accumulation saves memory, not time: with memory to spare, use one micro-batch "
                        f"{factor}x larger ({change})"),
        verify_with=ctx.tune_command("batch_size"),
        impact=0.0,
    )


def _primary(ctx: CheckContext) -> str:
    opt = ctx.primary_optimizer()
    return ctx.optimizer_label(opt) if opt else "the optimizer"


def no_step_found(ctx: CheckContext) -> Finding | None:
    """The run recorded no step: say what was seen and how to mark one (without steps there is
    nothing to time, and --steps cannot stop the script)."""
    seen = ctx.first("step_boundary")
    if ctx.steps or seen is None:
        return None
    forwards, backwards = int(seen.get("forwards") or 0), int(seen.get("backwards") or 0)
    opt_steps = int(seen.get("optimizer_steps") or 0)
    why = ("no training forward of a module with trainable parameters (an inference-only script?)" if not forwards
           else "no backward" if not backwards
           else "the gradients were never cleared between the backward and the next forward, so every "
                "backward looked like one more micro-batch of the same step" if not opt_steps
           else "the optimizer steps were not the primary optimizer's")
    return Finding(
        id="no_step_found",
        severity="warning",
        title="No training step was found, so no step was timed",
        evidence=(f"the run showed {forwards} training forwards, {backwards} backwards and {opt_steps} "
                  f"torch.optim optimizer steps: {why}"),
        recommendation=("mark the end of each training step with one line in the loop, after the parameter "
                        "update: `import trainspeed` at the top, then `trainspeed.step()` (a no-op outside the "
                        "doctor); the doctor then times every step and --steps N stops the run"),
        verify_with=ctx.doctor_command(),
        impact=1.0,
    )


CHECKS = (fp32_on_tensor_cores, optimizer_not_fused, data_parallel, not_compiled, low_gpu_utilization,
          memory_pressure, accumulation_for_speed, compute_bound, no_step_found)
