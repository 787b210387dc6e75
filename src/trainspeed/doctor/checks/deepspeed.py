"""DeepSpeed findings: what the engine's own config and the loop around it show.

The doctor observes each DeepSpeedEngine at its first step (observation "deepspeed": ZeRO
stage, bf16/fp16, offloading, overlap_comm, contiguous_gradients, batch sizes, data-parallel
size, parameter count, the memory of the device it trains on) and a torch.autocast around the
engine's forward ("deepspeed_autocast"); see doctor/instrument/deepspeed.py.
"""

from __future__ import annotations

from typing import Any

from trainspeed.doctor.checks.context import CheckContext, pct
from trainspeed.doctor.findings import Finding
from trainspeed.engine.deepspeed_facts import engine_precision
from trainspeed.report.fmt import fmt_bytes

STATE_SHARE = 0.25
"""ZeRO-3 or offloading is more than the memory needs when the whole training state (weights,
gradients, optimizer state, unpartitioned) takes at most a quarter of the device memory, times
the processes that share it: the rest is for activations, the allocator's cache, ZeRO's
communication buckets and the data."""
MEASURED_SHARE = 0.8
"""On CUDA, with the run's peak allocation measured: the peak plus the whole state again must
stay under 80 % of the device (the peak already holds this rank's part of the state: counting
it twice errs on the safe side)."""
UNUSED_SHARE = 0.45
"""A micro-batch leaves memory unused when the peak allocation is below 45 % of the device:
twice the micro-batch then needs at most twice the peak (the model's state does not grow with
it), which still leaves 10 % free."""
PLAN_SHARE = 0.9
"""The share of device memory a larger micro-batch is sized to at most (see UNUSED_SHARE)."""
SMALL_STATE_OPTIMIZERS = ("sgd", "adagrad", "lion", "rmsprop")
"""Optimizers with one fp32 value of state per parameter; Adam-like ones (and unknown ones,
to err on the safe side) keep two."""


def engine(ctx: CheckContext) -> dict[str, Any] | None:
    """The first DeepSpeed engine's settings, when the script used one."""
    return ctx.first("deepspeed")


def config_name(ctx: CheckContext, info: dict[str, Any]) -> str:
    """How to name the engine's config in advice: its file (as given to deepspeed.initialize,
    or the script's --deepspeed_config), the dict built in the code at the user's
    deepspeed.initialize call (HelloDeepSpeed's train_bert_ds.py), else "the DeepSpeed config"."""
    if ours(info):
        return "the DeepSpeed config the engine built (distributed.* in config.yaml)"
    path = info.get("config")
    if not (isinstance(path, str) and path):
        for obs in ctx.obs("script_flags"):
            for row in obs.get("flags") or []:
                if isinstance(row, dict) and row.get("dest") in ("deepspeed_config", "deepscale_config"):
                    path = row.get("value") if isinstance(row.get("value"), str) else path
    if isinstance(path, str) and path:
        return f"the DeepSpeed config ({path})"
    init = ctx.first("deepspeed_initialize") or {}
    if init.get("config") == "dict" and init.get("site"):
        return f"the DeepSpeed config dict passed to deepspeed.initialize at {init['site']}"
    return "the DeepSpeed config"


def ours(info: dict[str, Any]) -> bool:
    """The Trainer's own DeepSpeed engine (distributed.strategy=deepspeed): advice names the
    engine's keys (distributed.zero_stage, data.batch_size) and its config's tune, not a JSON
    edit and a doctor re-run of a script."""
    return bool(info.get("trainspeed_engine"))


def verify(ctx: CheckContext, info: dict[str, Any], topic: str | None, after: str) -> str:
    """verify_with: the tune of `topic` where a knob covers it (the config's, or the script's,
    which passes an edited copy of its --deepspeed_config JSON); else the run again (doctor or
    train), after the change."""
    return (ctx.tune_command(topic) if topic else None) or ctx.doctor_command() + f" (after the change: {after})"


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
    fix = f"set {settings} in zero_optimization"
    if ours(info):  # overlap_comm is an engine key; contiguous_gradients stays DeepSpeed's
        fix = " and ".join(["distributed.overlap_comm=true"] * ("overlap_comm" in off)
                           + ['"contiguous_gradients": true in zero_optimization of distributed.deepspeed']
                           * ("contiguous_gradients" in off))
    return Finding(
        id="deepspeed_zero2_overlap",
        severity="warning",
        title=f"ZeRO-2 with {' and '.join(off)} off",
        evidence=(f"{config_name(ctx, info)} runs ZeRO stage 2 on {world} data-parallel processes with "
                  f"{', '.join(f'{key}=false' for key in off)}; the backward (which includes ZeRO's gradient "
                  f"reduction) takes {pct(share)} of step time"),
        recommendation=f"{fix}: overlap_comm reduces gradient buckets while the backward still runs; "
                       "contiguous_gradients copies them into one buffer as they are produced (less "
                       "fragmentation, faster reduction)",
        # not the tune: its one-process trials reduce nothing, the gain needs all the processes
        verify_with=verify(ctx, info, None, "the backward share should drop"),
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


def state_bytes(info: dict[str, Any]) -> tuple[int, str]:
    """(bytes per parameter of the whole training state, what they are) under the engine's
    config: half-precision weights and gradients plus the optimizer's fp32 master copy, or fp32
    weights and gradients; plus the optimizer's state (ZeRO paper: 16 bytes for mixed-precision
    Adam)."""
    name = str(info.get("basic_optimizer") or "")
    known = name not in ("", "NoneType")
    moments = 4 if any(k in name.lower() for k in SMALL_STATE_OPTIMIZERS) else 8
    state = f"{name if known else 'an Adam-like optimizer'}'s state {moments}{'' if known else ', assumed'}"
    precision = engine_precision(info)
    if precision in ("bf16", "fp16"):
        return 2 + 2 + 4 + moments, f"{precision} weights and gradients 2 + 2, fp32 master weights 4, {state}"
    return 4 + 4 + moments, f"fp32 weights and gradients 4 + 4, {state}"


def _memory(ctx: CheckContext, info: dict[str, Any]) -> tuple[float | None, str]:
    """(bytes, name) of the memory the engine trains in: as observed with the engine, else the
    device observation's CUDA total."""
    total = info.get("device_memory")
    if isinstance(total, (int, float)) and total > 0:
        return float(total), str(info.get("device_memory_of") or "device memory")
    device = ctx.first("device") or {}
    total = device.get("total_memory")
    if isinstance(total, (int, float)) and total > 0:
        return float(total), f"{device.get('name') or 'GPU'} memory"
    return None, "device memory"


def _cuda_peak(ctx: CheckContext) -> float | None:
    """The run's peak CUDA allocation (bytes), when measured on a CUDA run."""
    peak = (ctx.summary.get("memory") or {}).get("cuda_alloc_peak")
    return float(peak) if ctx.device_type == "cuda" and isinstance(peak, (int, float)) and peak > 0 else None


def zero_beyond_memory(ctx: CheckContext) -> Finding | None:
    """ZeRO-3 or offloading on a model whose whole training state fits on one device with room
    to spare (STATE_SHARE, and MEASURED_SHARE with a measured peak): stage 3 all-gathers every
    parameter before each micro-batch's forward and again for its backward, offloading copies
    gradients and weights between device and host every step, and neither buys anything here.
    An engine on the CPU offloading to cpu is not offloading (see on_cpu)."""
    info = engine(ctx)
    if not info:
        return None
    stage, offload_opt, offload_param = (info.get(k) for k in ("zero_stage", "offload_optimizer", "offload_param"))
    on_cpu: list[str] = []
    if info.get("device") == "cpu":
        # an engine that trains on the CPU (DS_ACCELERATOR=cpu) offloads to the memory it already
        # uses: nothing leaves a device and no memory is saved or spent, and removing the offload
        # is no speed fix there: DeepSpeedCPUAdam's step was faster than the FusedAdam that
        # replaces it (docs/real-scripts-deepspeed.md)
        if offload_opt == "cpu":
            on_cpu.append("offload_optimizer")
            offload_opt = False
        if offload_param == "cpu":
            on_cpu.append("offload_param")
            offload_param = False
    params, (memory, memory_of) = info.get("params"), _memory(ctx, info)
    if not (stage == 3 or offload_opt or offload_param) or not isinstance(params, int) or not params or not memory:
        return None  # nothing beyond stage 2, or nothing to weigh it against
    per_param, parts = state_bytes(info)
    full = params * per_param
    shared = int(info.get("memory_shared_by") or 1)
    peak = _cuda_peak(ctx)
    if full * shared > STATE_SHARE * memory or (peak is not None and peak + full > MEASURED_SHARE * memory):
        return None
    world = int(info.get("dp_world_size") or 1)
    micro_batches = int(info.get("accumulation_steps") or 1)
    weight = 2 if engine_precision(info) in ("bf16", "fp16") else 4
    offloaded = [f"{what} offloaded to {where}" for what, where in
                 (("the optimizer", offload_opt), ("the parameters", offload_param)) if where]
    used = f"ZeRO stage {stage}" + (f" with {' and '.join(offloaded)}" if offloaded else "")
    sharing = f" x {shared} processes sharing it" if shared > 1 else ""
    evidence = (f"{config_name(ctx, info)} runs {used}, on {world} process{'es' if world > 1 else ''}; "
                f"the model's whole training state is {fmt_bytes(full)} ({params:,} parameters x {per_param} bytes: "
                f"{parts}){sharing}, {pct(full * shared / memory)} of the {fmt_bytes(memory)} of {memory_of}")
    if peak is not None:
        evidence += f" (peak allocated in this run: {fmt_bytes(peak)}, {pct(peak / memory)})"
    if on_cpu:
        evidence += (f" ({' and '.join(on_cpu)} to cpu left as is: this engine trains on the CPU, so it moves "
                     "nothing off a device)")
    costs, fixes = [], []
    if stage == 3:
        gathered = fmt_bytes(2 * micro_batches * params * weight)
        costs.append(f"stage 3 all-gathers every parameter before each micro-batch's forward and again for its "
                     f"backward ({gathered} of weights per step over {micro_batches} "
                     f"micro-batch{'es' if micro_batches > 1 else ''}) "
                     f"and releases them after; forward and backward take "
                     f"{pct(ctx.share('forward') + ctx.share('backward'))} of step time"
                     + ("; with one process it partitions nothing, so it saves no memory at all" if world == 1 else ""))
        lower = 0 if world == 1 else 2
        why = ("one process has nothing to partition" if world == 1 else
               f"stage 2 still partitions gradients and optimizer state over the {world} processes and keeps whole "
               "weights on each, so forward and backward gather nothing")
        fixes.append((f"distributed.zero_stage={lower}" if ours(info) else
                      f'set "stage": {lower} in "zero_optimization" (the key zero_optimization.stage)') + f": {why}")
    if offload_opt:
        costs.append(f"offloading the optimizer copies the gradients to {offload_opt} and the updated weights back "
                     f"every step ({fmt_bytes(2 * params * weight)}) and steps {info.get('basic_optimizer')} there; "
                     f"the optimizer phase takes {pct(ctx.share('optimizer'))} of step time")
    if offload_param:
        costs.append(f"offloading the parameters fetches them from {offload_param} for every forward and backward")
    offloads = [key for key, on in (("offload_optimizer", offload_opt), ("offload_param", offload_param)) if on]
    if offloads:
        quoted = " and ".join(f'"{key}"' for key in offloads)
        keys = ", ".join(f"zero_optimization.{key}" for key in offloads)
        fixes.append(f'remove {quoted} from "zero_optimization" ({keys})')
    return Finding(
        id="deepspeed_zero_beyond_memory",
        severity="warning",
        title=f"{used} on a model whose training state fits in {pct(full * shared / memory)} of {memory_of}",
        evidence=f"{evidence}; {'; '.join(costs)}",
        recommendation=f"in {config_name(ctx, info)}: {'; '.join(fixes)}. The whole state fits with room to spare, "
                       "so the lower setting costs no memory the run is short of",
        verify_with=verify(ctx, info, "zero_stage" if stage == 3 else None, "the step time should drop"),
        impact=0.0,
    )


def micro_batch_headroom(ctx: CheckContext) -> Finding | None:
    """On CUDA, a micro-batch whose peak allocation stays under UNUSED_SHARE of the device:
    a larger train_micro_batch_size_per_gpu gives the GPU more work per kernel and per step's
    fixed costs. With gradient accumulation, accumulation_for_speed (hardware.py) already says
    to trade it for a larger micro-batch: this one stands down."""
    info = engine(ctx)
    peak = _cuda_peak(ctx)
    if not info or peak is None:
        return None
    memory, memory_of = _memory(ctx, info)
    micro, world = info.get("micro_batch_size"), int(info.get("dp_world_size") or 1)
    factor = (ctx.first("accumulation") or {}).get("factor")
    if isinstance(factor, int) and factor > 1:
        return None  # accumulation_for_speed's advice
    if not memory or peak >= UNUSED_SHARE * memory or not isinstance(micro, int):
        return None
    grow = 2
    while grow < 8 and 2 * grow * peak <= PLAN_SHARE * memory:
        grow *= 2
    larger, accum = micro * grow, int(info.get("accumulation_steps") or 1)
    return Finding(
        id="deepspeed_micro_batch_headroom",
        severity="info",
        title=f"The micro-batch of {micro} leaves {pct(1 - peak / memory)} of {memory_of} unused",
        evidence=(f"peak allocated {fmt_bytes(peak)} of {fmt_bytes(memory)} ({pct(peak / memory)}) with "
                  f"train_micro_batch_size_per_gpu={micro}, gradient_accumulation_steps={accum} in "
                  f"{config_name(ctx, info)}; "
                  f"{grow}x the micro-batch needs at most {grow}x the peak ({pct(grow * peak / memory)}): the "
                  "model's state does not grow with it"),
        recommendation=((f"data.batch_size={larger} (now {micro}; the engine sets train_micro_batch_size_per_gpu "
                         "from it)" if ours(info) else
                         f'set "train_micro_batch_size_per_gpu": {larger} (now {micro}) in {config_name(ctx, info)}, '
                         f'and "train_batch_size": {larger * accum * world} if it sets one (DeepSpeed requires '
                         "micro-batch x gradient_accumulation_steps x processes)")
                        + f"; the global batch grows {grow}x, so scale the learning rate with it and compare samples/s"),
        verify_with=verify(ctx, info, "batch_size", "compare samples/s"),
        impact=0.0,
    )


CHECKS = (autocast_in_engine, zero2_overlap, batch_mismatch, zero_beyond_memory, micro_batch_headroom)
