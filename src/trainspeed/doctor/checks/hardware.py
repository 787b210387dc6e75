"""Findings about how the script uses the device: precision, optimizer implementation,
DataParallel, compilation, GPU utilization, memory headroom, gradient accumulation."""

from __future__ import annotations

from typing import Any

from trainspeed.doctor.checks.context import CheckContext, pct
from trainspeed.doctor.checks.optimizer_kernels import optimizer_not_fused
from trainspeed.doctor.checks.script_flags import flag_note, script_flag, set_flag, show_flag
from trainspeed.doctor.findings import Finding
from trainspeed.telemetry.env import expandable_segments_on
from trainspeed.telemetry.throughput import COMPUTE_BOUND_MFU

TENSOR_CORE_CAPABILITY = 7.0
"""Volta (sm_70) and newer have tensor cores: fp16/bf16 matmuls run several times faster than
fp32 (NVIDIA "Train with Mixed Precision" guide; PyTorch AMP recipe)."""
GPU_BUSY_NOTICE = 0.8
"""Below 80 % busy over the measured steps (NVML utilization inside their window,
telemetry/gpu_busy.py) the GPU's idle time is worth explaining. NVML counts a period as busy
when any kernel ran in it, so a launch-bound loop of tiny kernels can read well above half busy:
the threshold is not 50 %."""
IDLE_UNEXPLAINED_NOTICE = 0.05
"""GPU idle time that the data wait, the copies and the reads' wait leave unexplained below
this share is not worth a finding of its own."""
IDLE_UNEXPLAINED_WARNING = 0.2
"""A fifth of the step with the GPU idle for no measured host stretch: a warning."""
HOST_BETWEEN_STEPS = 0.2
"""Share of the step outside the training phases from which the idle GPU is put on the host's
Python between the steps rather than on kernel launches."""
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
    return ctx.precision != "fp32" or any(m.get("autocast") for m in ctx.models())


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
    impact, estimated, basis = precision_stake(ctx, device, "bf16" if bf16 else "fp16")
    recommendation = (f"run forward/backward under torch.autocast('cuda', dtype=torch.{dtype.split()[0]}) "
                      f"(engine: precision.mode={'bf16' if bf16 else 'fp16'}-mixed)")
    if ctx.engine_run:
        recommendation = f"precision.mode={'bf16' if bf16 else 'fp16'}-mixed in the run's config"
    return Finding(
        id="fp32_on_tensor_cores",
        severity="warning",
        title="Training in fp32 on a GPU with tensor cores",
        evidence=f"{device.get('name', 'GPU')} (sm_{cap:.1f}), parameters float32, no autocast{tf32}",
        recommendation=recommendation,
        verify_with=ctx.tune_command("precision"),
        impact=impact,
        impact_estimated=estimated,
        basis=basis,
    )


def precision_stake(ctx: CheckContext, device: dict[str, Any], low: str) -> tuple[float, bool, str]:
    """(share at stake, estimated, basis) of fp32 matmuls on a device with `low` (bf16/fp16)
    tensor cores: the matmuls' share of the step times (1 - fp32 peak / low peak of this device).
    The matmuls' share is at least the FLOPs counted at the fp32 (or TF32, when it is on) peak
    over the measured step (the MFU against that peak), at most forward + backward; without a
    FLOP count it is forward + backward's share, an upper bound (estimated)."""
    from trainspeed.telemetry.peaks import lookup_peak

    name = str(device.get("name") or "")
    fp32_kind = "tf32" if device.get("tf32_matmul") or device.get("float32_matmul_precision") in ("high", "medium") else "fp32"
    high, fast = lookup_peak(name, fp32_kind), lookup_peak(name, low)
    if high is None or fast is None or fast.flops <= 0:
        return 0.0, False, (f"the {fp32_kind}/{low} peak ratio of {name or 'this GPU'} is not in the peak table: "
                            "nothing derived, measure it with the tune")
    gain = max(0.0, 1.0 - high.flops / fast.flops)
    compute = ctx.share("forward") + ctx.share("backward")
    flops, step = ctx.summary.get("flops_per_step"), ctx.step_mean
    if isinstance(flops, (int, float)) and flops > 0 and step:
        matmul = flops / (high.flops * step)
        if compute > 0:
            matmul = min(matmul, compute)
        return matmul * gain, False, (f"the matmuls take at least {pct(matmul)} of the step (FLOPs at the "
                                      f"{fp32_kind} peak, {high.flops / 1e12:.0f} TFLOP/s) x (1 - {fp32_kind}/{low} "
                                      f"peak {high.flops / fast.flops:.2f})")
    return compute * gain, True, (f"forward + backward take {pct(compute)} of the step, an upper bound on the "
                                  f"matmuls' share (no FLOP count) x (1 - {fp32_kind}/{low} peak "
                                  f"{high.flops / fast.flops:.2f})")


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
        impact=ctx.share("forward"),
        impact_estimated=True,
        basis=f"the forward, where DataParallel replicates the model and scatters the batch, {pct(ctx.share('forward'))} of the step (an upper bound)",
    )


def not_compiled(ctx: CheckContext) -> Finding | None:
    models = ctx.models()
    if not models or any(m.get("compiled") for m in models):
        return None
    framework = (ctx.first("framework") or {}).get("name", "plain")
    flag = script_flag(ctx, "compile")
    trained = [str(m.get("class")) for m in models if m.get("trained_by")]
    how = (f"{set_flag(flag, True)} (the script's flag, now {show_flag(flag)})" if flag
           else "compile.mode=default in the run's config" if ctx.engine_run
           else "engine.compile() after deepspeed.initialize" if ctx.first("deepspeed")
           # a GAN's two: compiling one leaves the other's steps eager (the tune compiles each)
           else f"compile each trained model in place where it is built ({', '.join(trained)}): `net.compile()`"
           if len(trained) > 1 else "model = torch.compile(model)")
    return Finding(
        id="not_compiled",
        severity="info",
        title="The model is not compiled",
        evidence=(f"{', '.join(str(m.get('class')) for m in models[:3])} run{'s' if len(models) == 1 else ''} "
                  f"eagerly ({framework} loop); torch.compile fuses elementwise ops"
                  f"{flag_note(ctx, 'compile')}"),
        recommendation=f"{how}{'' if ctx.engine_run else ' (engine: compile.mode=default)'}; measure it, gains vary",
        verify_with=ctx.tune_command("compile"),
        impact=0.0,
        advises={"compile": "*"},  # a tune that read compile as no gain ends the advice (doctor/tuned.py)
    )


def low_gpu_utilization(ctx: CheckContext) -> Finding | None:
    """The GPU idles over the measured steps (NVML inside their window, never the life of the
    process), and what is at stake is the idle time that the data wait, the copies and the
    reads' wait do not already claim (their own findings name those): the host's own work,
    launching kernels or, when much of the step lies outside the training phases, Python
    between the steps. A busy figure below the MFU is not a measurement of the steps
    (telemetry/gpu_busy.py) and makes no finding."""
    if ctx.device_type != "cuda":
        return None
    parts, residual, claimed = _idle_left(ctx)
    busy = parts.busy
    if busy is None or residual is None or busy >= GPU_BUSY_NOTICE:
        return None
    if residual < IDLE_UNEXPLAINED_NOTICE or _retrying(ctx):
        return None
    found = ctx.summary.get("gpu_busy") or {}
    batch = ctx.first("batch") or {}
    size = batch.get("batch_size")
    mfu = (ctx.summary.get("mfu") or {})
    mfu_value = mfu.get("value") if mfu.get("valid") else None
    evidence = [f"GPU busy {pct(busy)} of the measured steps ({found.get('basis')})"]
    if mfu_value is not None:
        evidence.append(f"MFU {pct(mfu_value)}")
    if size is not None:
        evidence.append(f"batch size {size}")
    explained = parts.data + parts.h2d + claimed
    between = ctx.share("other")
    python_between = between >= HOST_BETWEEN_STEPS  # else the host is launching kernels
    if explained >= 0.005:
        evidence.append(f"the data wait, copies and reads' wait explain {pct(explained)} of the idle "
                        f"{pct(parts.idle)}; {pct(residual)} is "
                        + ("Python between the steps" if python_between else "the host launching kernels"))
    if python_between:
        evidence.append(f"{pct(between)} of the step lies outside the data, forward, backward and optimizer phases")
    fix = ("compile.mode=reduce-overhead (CUDA graphs) or a larger data.batch_size in the run's config" if ctx.engine_run else
           "fewer, larger kernels: torch.compile(model) fuses the small ops, mode='reduce-overhead' also "
           "replays the step as CUDA graphs; or a bigger batch, so that each launch carries more work")
    if python_between and not ctx.engine_run:
        fix = ("the host's Python work between the steps holds the GPU idle: do it less often, in a "
               "DataLoader worker or a thread, or give each step more GPU work (a bigger batch); then " + fix)
    return Finding(
        id="low_gpu_utilization",
        severity="warning" if residual >= IDLE_UNEXPLAINED_WARNING else "info",
        title=("The GPU idles while the host works between the steps" if python_between
               else "The GPU idles between kernels: the step is launch-bound"),
        evidence=", ".join(evidence),
        recommendation=fix,
        verify_with=ctx.tune_command("compile", "batch_size"),
        impact=residual,
        basis=(f"GPU idle {pct(parts.idle)} of the measured steps (NVML) less the data wait, copies and "
               f"reads' wait ({pct(explained)})"),
    )


def _idle_left(ctx: CheckContext) -> tuple[Any, float | None, float]:
    """(the step's GPU time parts, the GPU idle share no measured host stretch explains: not
    the data wait, the copies, nor the reads' wait when the loop reads every step, the share
    the syncs claimed). None without a GPU busy figure."""
    from trainspeed.doctor.checks.gpu_time import gpu_time
    from trainspeed.doctor.checks.syncs import SYNCS_PER_STEP_WARNING

    parts = gpu_time(ctx)
    rate = ctx.summary.get("syncs_per_step")
    every_step = isinstance(rate, (int, float)) and rate >= SYNCS_PER_STEP_WARNING
    claimed = parts.sync_stake()[0] if every_step else 0.0
    unexplained = parts.idle_unexplained
    return parts, None if unexplained is None else max(0.0, unexplained - claimed), claimed


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
    fp64 = ctx.precision == "fp64"  # autocast leaves float64 as it is
    helps = ["float32 in place of float64 (the fp64 finding)"] if fp64 else []
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
        verify_with=ctx.tune_command("compile") if no_bf16 or fp64 else ctx.tune_command("precision", "compile"),
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
        impact, basis = _retry_stake(ctx, retries)
        expandable = expandable_segments_on(ctx.run.env.get("alloc_conf") if isinstance(ctx.run.env, dict) else None)
        allocator = ("expandable segments are already on (PYTORCH_CUDA_ALLOC_CONF)" if expandable else
                     "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, so that batches whose sizes change "
                     "grow one segment instead of fragmenting the cache")
        return Finding(
            id="memory_near_oom",
            severity="warning",
            title="GPU memory is nearly full",
            evidence=(f"peak reserved {pct(reserved)} of device memory, peak allocated {pct(alloc)}, "
                      f"allocator retries {retries}"),
            recommendation=("lower the batch size or activation memory (engine: activation_checkpointing=[Block], "
                            f"precision.mode=bf16-mixed, batch.auto_microbatch=true); {allocator}"),
            verify_with=None if expandable else ctx.tune_command("expandable_segments"),
            impact=impact,
            basis=basis,
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


def _retry_stake(ctx: CheckContext, retries: Any) -> tuple[float, str]:
    """(share at stake, basis) of allocator retries: each frees the cached blocks (a device-wide
    sync) and allocates again while the GPU waits, so with retries on most measured steps the
    GPU idle time that the data wait, the copies and the reads' wait leave unexplained is theirs."""
    measured = _measured_steps(ctx)
    if not _on_most_steps(retries, measured):
        return 0.0, ""
    parts, residual, _ = _idle_left(ctx)
    if residual is None:
        return 0.0, "no GPU busy figure over the measured steps: the retries' cost is not measured"
    return residual, (f"{int(retries)} allocator retries over {measured} measured steps; the GPU idles "
                      f"{pct(parts.idle)} of them, {pct(residual)} not explained by the data wait, copies or syncs")


def _retrying(ctx: CheckContext) -> bool:
    """Allocator retries on at least half the measured steps (memory_pressure claims the idle GPU)."""
    _, _, retries = _memory_fraction(ctx)
    return _on_most_steps(retries, _measured_steps(ctx))


def _measured_steps(ctx: CheckContext) -> int:
    return int(ctx.summary.get("measured_steps") or ctx.steps or 0)


def _on_most_steps(retries: Any, measured: int) -> bool:
    """Allocator retries on at least half the measured steps: the one rule _retry_stake and
    _retrying share."""
    return isinstance(retries, (int, float)) and retries >= 0.5 * max(1, measured)


CUDNN_HEURISTICS_MATCH = 90000
"""From cuDNN 9 on, the library's own heuristics picked the algorithms the autotuner picks: on an
H100 (torch 2.11, cuDNN 9) cudnn.benchmark=True changed six fixed-shape conv nets (bf16 and
fp32, 3x3 to 7x7, grouped) by 1.00x (benchmarks/gpu_cudnn_benchmark.py)."""


def cudnn_benchmark_off(ctx: CheckContext) -> Finding | None:
    """A convolutional model on CUDA with cuDNN's autotuner off: for fixed input shapes
    torch.backends.cudnn.benchmark = True picks the fastest convolution algorithms once. With
    cuDNN 9 or later that was measured to win nothing, so it is a thing to try (info), with
    nothing put at stake; before cuDNN 9, forward + backward is its upper bound."""
    device = ctx.first("device") or {}
    if ctx.device_type != "cuda" or device.get("cudnn_benchmark") is not False:
        return None
    if not any(m.get("convolutional") for m in ctx.models()):
        return None
    compute = ctx.share("forward") + ctx.share("backward")
    version = ctx.run.env.get("cudnn") if isinstance(ctx.run.env, dict) else None
    recent = isinstance(version, int) and version >= CUDNN_HEURISTICS_MATCH
    evidence = (f"a convolutional model on {device.get('name', 'the GPU')} with torch.backends.cudnn.benchmark="
                f"False; forward + backward take {pct(compute)} of the step")
    if recent:
        evidence += (f"; with cuDNN {version} the heuristics usually pick what the autotuner would "
                     "(measured 1.00x on six conv nets on an H100): worth a measurement, not a guess")
    return Finding(
        id="cudnn_benchmark_off",
        severity="info" if recent else "warning",
        title="cuDNN picks convolution algorithms without measuring them (cudnn.benchmark off)",
        evidence=evidence,
        recommendation="torch.backends.cudnn.benchmark = True before training, when the input shapes are fixed",
        verify_with=ctx.tune_command("cudnn_benchmark"),
        impact=0.0 if recent else compute,
        impact_estimated=True,
        basis=(f"nothing put at stake: cuDNN {version} matched the autotuner's picks where measured" if recent
               else f"forward + backward, where the convolutions run, {pct(compute)} of the step (an upper bound)"),
    )


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
    flags = None if ds else _accumulation_flags(ctx, factor)
    if flags:
        now = " ".join(show_flag(f) for f, _ in flags)
        change = f"{' '.join(set_flag(f, v) for f, v in flags)}: the script's flags, now {now}; {change}"
    return Finding(
        id="accumulation_for_speed",
        severity="info",
        title=f"Gradient accumulation over {factor} micro-batches without memory pressure",
        evidence=f"{factor} backward passes on new inputs (micro-batches) per update of {_primary(ctx)}; {room}",
        recommendation=("accumulation saves memory, not time: with memory to spare, use one micro-batch "
                        f"{factor}x larger ({change})"),
        verify_with=(ctx.doctor_command(flags=[set_flag(f, v) for f, v in flags]) if flags
                     else ctx.tune_command("batch_size")),
        impact=0.0,
    )


def _accumulation_flags(ctx: CheckContext, factor: int) -> list[tuple[dict, int]] | None:
    """[(accumulation flag, 1), (batch-size flag, factor x its value)] when the script takes both
    and the accumulation flag reads the measured factor (llama2.c's --gradient_accumulation_steps=4
    --batch_size=8 -> 1 and 32), else None."""
    steps, batch = script_flag(ctx, "accumulation_steps"), script_flag(ctx, "batch_size")
    if not steps or not batch:
        return None
    value, size = steps.get("value"), batch.get("value")
    if value != factor or not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return None
    return [(steps, 1), (batch, size * factor)]


def _primary(ctx: CheckContext) -> str:
    opt = ctx.primary_optimizer()
    return ctx.optimizer_label(opt) if opt else "the optimizer"


CHECKS = (fp32_on_tensor_cores, optimizer_not_fused, data_parallel, not_compiled, low_gpu_utilization,
          memory_pressure, cudnn_benchmark_off, accumulation_for_speed, compute_bound)
