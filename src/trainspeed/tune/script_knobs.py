"""The script tuner's knobs: for an unchanged script, which settings to try.

Same shape as knobs.py (a knob is `(ctx) -> list[Candidate | Skip]`), but a setting is a patch
key of `trainspeed.patches` (`loader.num_workers`, `precision`, ...) applied at run time, or a
script flag (`args.--workers`) where the script's own argparse holds the setting: then the
result is stated as the flag to pass. What-ifs (`log_every`, `checkpoint_every`, `no_gc`)
measure what a finding costs by thinning or removing it; they are reported, never combined.
Knob names match the ones the doctor's findings print (`trainspeed tune --knobs K -- CMD`).
A DeepSpeed script's ZeRO settings are edits of its config JSON (script_zero_knobs.py).
"""

from __future__ import annotations

import math
from typing import Any

from trainspeed.doctor.checks.script_flags import BOOL_TYPES, padding_flag
from trainspeed.tune.knob_types import MIN_EFFECT
from trainspeed.tune.knobs import COMPILE_COST_FACTOR, COMPILE_STARTUP_S, Candidate, Skip, _powers_up_to
from trainspeed.tune.script_context import ScriptContext
from trainspeed.tune.script_zero_knobs import DS_CONFIG_PREFIX, bucket_size, edited_ds_config, overlap_comm, zero_stage


def _flag_setting(ctx: ScriptContext, topic: str, value: Any) -> dict[str, Any] | None:
    """{"args.--workers": 4} when the script has a flag for `topic` whose parsed value is the
    one in effect (a flag the script ignores for this loader would measure nothing)."""
    flag = ctx.facts.flag_for(topic)
    if flag is None:
        return None
    if topic == "num_workers" and flag.get("value") != (ctx.facts.loader or {}).get("num_workers"):
        return None
    return {f"args.{flag['option']}": value}




def _bool_flag_setting(ctx: ScriptContext, topic: str) -> dict[str, Any] | None:
    """{"args.--bf16": True} when the script has an off boolean switch for `topic` (store_true,
    or a `--x True/False` flag such as HfArgumentParser's string_to_bool), else None."""
    flag = ctx.facts.flag_for(topic)
    if flag is None or flag.get("value") is not False:
        return None
    if flag.get("kind") == "storetrue" or (flag.get("kind") in ("store", "equals", "booleanoptional")
                                           and flag.get("type") in BOOL_TYPES):
        return {f"args.{flag['option']}": True}
    return None


def _amp_flag_setting(ctx: ScriptContext) -> dict[str, Any] | None:
    """{"args.--amp": True, "args.--amp-dtype": "bfloat16"} when the script has an off `--amp`
    switch and a flag for its dtype (timm's train.py): its own mixed precision, measured and
    handed back as the flags to pass. `--amp` alone is left to the patch: scripts that have
    only it mean fp16, which a CPU emulates."""
    amp, dtype = _bool_flag_setting(ctx, "amp"), ctx.facts.flag_for("amp_dtype")
    if amp is None or dtype is None or dtype.get("kind") not in ("store", "equals"):
        return None
    choices = dtype.get("choices") or []
    value = next((c for c in ("bfloat16", "bf16") if not choices or c in choices), None)
    return {**amp, f"args.{dtype['option']}": value} if value else None


def _bf16_flag_setting(ctx: ScriptContext) -> dict[str, Any] | None:
    """The script's --bf16 switch; on a CPU with TrainingArguments' --use_cpu too: without it
    transformers refuses bf16 on a machine with no bf16 GPU ("Your setup doesn't support
    bf16/gpu. You need to assign use_cpu if you want to train the model on CPU")."""
    setting = _bool_flag_setting(ctx, "bf16")
    if setting and ctx.device.type == "cpu":
        use_cpu = ctx.facts.flag_for("use_cpu")
        if use_cpu is not None and use_cpu.get("value") is False:
            setting.update(_bool_flag_setting(ctx, "use_cpu") or {})
    return setting


def num_workers(ctx: ScriptContext) -> list:
    """DataLoader workers of the training loader: 0, powers of two up to the cores (with the cores split between workers and compute threads on a CPU)."""
    if ctx.facts.loader is None:
        return [Skip("num_workers", "-", "the training loop uses no DataLoader (its batches are built in "
                                         "the main process), so there are no workers to add")]
    current = int(ctx.loader_value("num_workers") or 0)
    cores = max(1, ctx.device.cores)
    values = [n for n in [0] + _powers_up_to(cores) if n != current]

    def setting(n: int) -> dict[str, Any]:
        return _flag_setting(ctx, "num_workers", n) or {"loader.num_workers": n}

    out: list = [Candidate("num_workers", str(n), setting(n)) for n in values]
    if ctx.device.type == "cpu" and "threads" not in ctx.settings:
        # Workers and compute threads share the cores: each worker count is also tried with
        # the cores split between them (see knobs.num_workers).
        out += [Candidate("num_workers", f"{n} + {cores - n} compute threads", {**setting(n), "threads": cores - n})
                for n in values if 0 < n < cores]
    return out


def _needs_workers(knob: str, label: str, ctx: ScriptContext) -> Skip | None:
    if ctx.facts.loader is None:
        return Skip(knob, label, "no training DataLoader")
    if int(ctx.loader_value("num_workers") or 0) == 0:
        return Skip(knob, label, "needs num_workers > 0; tried on top of a num_workers winner", deferred=True)
    return None


def persistent_workers(ctx: ScriptContext) -> list:
    """Keep the training loader's workers between epochs (after a num_workers winner)."""
    skip = _needs_workers("persistent_workers", "true", ctx)
    if skip:
        return [skip]
    if ctx.loader_value("persistent_workers"):
        return [Skip("persistent_workers", "true", "already on")]
    return [Candidate("persistent_workers", "true", {"loader.persistent_workers": True})]


def prefetch_factor(ctx: ScriptContext) -> list:
    """Batches each worker loads ahead: 4 and 8 (after a num_workers winner)."""
    current = ctx.loader_value("prefetch_factor") or 2
    out: list = []
    for f in (4, 8):
        if f != current:
            out.append(_needs_workers("prefetch_factor", str(f), ctx)
                       or Candidate("prefetch_factor", str(f), {"loader.prefetch_factor": f}))
    return out


def pin_memory(ctx: ScriptContext) -> list:
    """Page-locked host batches for faster host-to-GPU copies (CUDA only)."""
    if ctx.device.type != "cuda":
        return [Skip("pin_memory", "true", "pinned memory speeds up host-to-GPU copies; there are none on a CPU")]
    if ctx.facts.loader is None:
        return [Skip("pin_memory", "true", "no training DataLoader")]
    if ctx.loader_value("pin_memory"):
        return [Skip("pin_memory", "true", "already on")]
    return [Candidate("pin_memory", "true", {"loader.pin_memory": True})]


def precision(ctx: ScriptContext) -> list:
    """bf16 (and fp16 with a GradScaler on CUDA) autocast around the trained module's forward."""
    t = ctx.facts.targets
    if t.autocast:
        return [Skip("precision", "bf16", f"the script already autocasts its forward ({t.autocast})")]
    if ctx.facts.model is None:
        return [Skip("precision", "bf16", "no trained module was seen")]
    if ctx.facts.model.get("param_dtype") == "float64":
        return [Skip("precision", "bf16", "the model is float64, which autocast leaves as it is: make it float32 "
                                          "first (the doctor's fp64_model finding)")]
    cap = ctx.device.cuda_capability or (0, 0)
    out: list = []
    if ctx.device.type == "cuda" and cap < (8, 0):
        out.append(Skip("precision", "bf16", f"bf16 needs compute capability 8.0+, this GPU is {cap}"))
    else:
        # On a CPU bf16 is measured, not assumed: fast with AMX/avx512_bf16, emulated (far
        # slower, stopped early) without them. A script with its own switch (a Trainer's
        # TrainingArguments --bf16) is measured through it: the result is a flag to pass, where
        # the autocast patch's model call lies inside the library (transformers' trainer.py)
        # and its code change could only say "outside your project".
        out.append(Candidate("precision", "bf16", _bf16_flag_setting(ctx) or _amp_flag_setting(ctx)
                             or {"precision": "bf16"}))
    if ctx.device.type == "cuda":
        out.append(Candidate("precision", "fp16", {"precision": "fp16"}))
    else:
        out.append(Skip("precision", "fp16", "fp16 autocast on a CPU is emulated and far slower; bf16 is tried"))
    return out


def compile(ctx: ScriptContext) -> list:  # noqa: A001 - the knob's name
    """torch.compile of the trained module (or the script's own --compile flag)."""
    t = ctx.facts.targets
    flag = ctx.facts.flag_for("compile")
    if t.compiled or (flag and flag.get("value") is True):
        return [Skip("compile", "default", "the script already compiles its model")]
    if ctx.facts.model is None:
        return [Skip("compile", "default", "no trained module was seen")]
    if ctx.device.type == "cpu" and not ctx.device.has_compiler:
        return [Skip("compile", "default", "torch.compile on CPU needs a C++ compiler (g++/clang++) on PATH")]
    if flag is not None and flag.get("kind") in ("storetrue", "equals", "store", "booleanoptional"):
        value = True if (flag.get("kind") != "store" or flag.get("type") in (None, *BOOL_TYPES)
                         or flag.get("bare_value") is not None) else 1
        from trainspeed.doctor.checks.script_flags import set_flag

        # labelled as the user passes it (nanoGPT's row read "compile default" for --compile=True)
        return [Candidate("compile", set_flag(flag, value), {f"args.{flag['option']}": value}, cost_factor=COMPILE_COST_FACTOR,
                          startup_s=COMPILE_STARTUP_S)]
    # Compilation happens in the warm-up steps, which a trial excludes.
    out = [Candidate("compile", "default", {"compile": "default"}, cost_factor=COMPILE_COST_FACTOR, startup_s=COMPILE_STARTUP_S)]
    if ctx.device.type == "cuda":
        # CUDA graphs replay the compiled step with one launch: what a launch-bound loop needs
        # (on an H100, 'default' alone gave launch_bound.py 1.19-1.40x, its kernels still
        # launched one by one).
        out.append(Candidate("compile", "reduce-overhead", {"compile": "reduce-overhead"}, cost_factor=COMPILE_COST_FACTOR,
                             startup_s=COMPILE_STARTUP_S))
    return out


def padding(ctx: ScriptContext) -> list:
    """Less padding through the script's own flags (script_flags.padding_flag): --pad_to_max_length
    off, each batch padded to its own longest sample; or --group_by_length on. A script without
    such a flag pads in its own code: the doctor's finding says what to change there."""
    found = padding_flag(ctx.facts.flags, already_dynamic=False)
    if found is None:
        if not any(f.get("id") == "padding_waste" for f in ctx.facts.findings):
            # a regression script's tune was told to pad each batch in its collate_fn: it has none
            return [Skip("padding", "-", "the doctor saw no padding waste in the baseline's batches")]
        return [Skip("padding", "-", "the script has no padding switch (--pad_to_max_length, --group_by_length): "
                                     "pad each batch to its longest sample in its collate_fn (the doctor's "
                                     "padding finding names how)")]
    flag, value = found
    return [Candidate("padding", "dynamic" if not value else "group_by_length", {f"args.{flag['option']}": value})]


def fused_optimizer(ctx: ScriptContext) -> list:
    """The optimizer's fused or foreach implementation."""
    opt = ctx.facts.optimizer
    if opt is None:
        return [Skip("fused_optimizer", "fused", "no torch.optim optimizer steps in this loop")]
    out: list = []
    takes = opt.get("implementations")  # None: a run recorded before it was
    for impl in ("fused", "foreach"):
        if opt.get(impl) is True:
            out.append(Skip("fused_optimizer", impl, "already on"))
        elif takes is not None and impl not in takes:
            # LBFGS: its one round of an 8m tune went to a trial that could only fail
            out.append(Skip("fused_optimizer", impl, f"{opt.get('class') or 'the optimizer'} has no {impl} "
                                                     "implementation"))
        else:
            out.append(Candidate("fused_optimizer", impl, {"optimizer.impl": impl}))
    return out


def threads(ctx: ScriptContext) -> list:
    """torch.set_num_threads below the core count (CPU)."""
    if ctx.device.type != "cpu":
        return [Skip("threads", "-", "compute threads matter on a CPU device")]
    cores = max(1, ctx.device.cores)
    return [Candidate("threads", str(n), {"threads": n}) for n in _powers_up_to(cores) if n != cores]


def package_lookups(ctx: ScriptContext) -> list:
    """functools.cache around a library's package check that it asks at every step (accelerate's
    is_lomo_available in AcceleratedOptimizer.step), found by the baseline's doctor run."""
    names = ctx.facts.lookup_checks
    if not names:
        return [Skip("package_lookups", "-", "no library looked a package up at every step of the baseline")]
    shown = ", ".join(name.rpartition(".")[2] for name in names)
    return [Candidate("package_lookups", f"cache {shown}", {"runtime.cache_checks": list(names)})]


def tf32(ctx: ScriptContext) -> list:
    """TF32 matmuls and convolutions (Ampere+ GPUs)."""
    cap = ctx.device.cuda_capability or (0, 0)
    if ctx.device.type != "cuda" or cap < (8, 0):
        return [Skip("tf32", "on", "TF32 needs an NVIDIA GPU of compute capability 8.0+")]
    return [Candidate("tf32", "on", {"cuda.tf32": True})]


def cudnn_benchmark(ctx: ScriptContext) -> list:
    """cuDNN autotuning of convolution kernels (CUDA, conv models)."""
    if ctx.device.type != "cuda":
        return [Skip("cudnn_benchmark", "on", "cuDNN autotuning exists on CUDA only")]
    if not ctx.facts.targets.convolutional:
        return [Skip("cudnn_benchmark", "on", "the model has no convolutions for cuDNN to tune")]
    return [Candidate("cudnn_benchmark", "on", {"cuda.cudnn_benchmark": True})]


def expandable_segments(ctx: ScriptContext) -> list:
    """The CUDA caching allocator's expandable segments, where the baseline ran near the memory
    limit (the doctor's memory_near_oom: allocator retries or a nearly full cache)."""
    if ctx.device.type != "cuda":
        return [Skip("expandable_segments", "on", "the caching allocator's segments exist on CUDA only")]
    if ctx.facts.expandable_segments:
        return [Skip("expandable_segments", "on", "the run already has expandable_segments:True in "
                                                  "PYTORCH_CUDA_ALLOC_CONF")]
    if not any(f.get("id") == "memory_near_oom" for f in ctx.facts.findings):
        return [Skip("expandable_segments", "on", "the baseline had no allocator retries and its GPU memory "
                                                  "was not nearly full: nothing for the allocator to win")]
    return [Candidate("expandable_segments", "on", {"cuda.expandable_segments": True})]


def channels_last(ctx: ScriptContext) -> list:
    """channels_last memory format for a convolutional model and its inputs."""
    if not ctx.facts.targets.convolutional:
        return [Skip("channels_last", "true", "the model has no Conv2d layers")]
    return [Candidate("channels_last", "true", {"channels_last": True})]


def attention(ctx: ScriptContext) -> list:
    """A Hugging Face model's attn_implementation: sdpa or eager."""
    if not ctx.facts.targets.hf_model:
        # no advice about code the script may not have (a single nn.Linear was told to call
        # F.scaled_dot_product_attention "in your own model")
        return [Skip("attention", "sdpa", "not a Hugging Face model: attn_implementation is a transformers "
                                          "setting")]
    return [Candidate("attention", impl, {"hf.attn_implementation": impl}) for impl in ("sdpa", "eager")]


def _interval_flag(ctx: ScriptContext, topic: str, factor: int, periodic: bool = False) -> Candidate | Skip | None:
    """The script's own interval flag (--log-interval 1), set `factor` times larger: a real
    setting the user keeps by passing the flag, not a what-if. `periodic`: its new interval is
    the candidate's period_steps (a log interval; a save interval x4 would make trials long)."""
    flag = ctx.facts.flag_for(topic)
    value = flag.get("value") if flag else None
    if flag is None or isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    from trainspeed.doctor.checks.script_flags import set_flag

    run, steps = ctx.facts.run_steps()
    if not periodic and steps is not None:
        # nanoGPT at --max_iters=60 with --eval_interval=30 x4 evaluated once, at iteration 0,
        # and saved no checkpoint at all: the largest factor whose interval falls inside the run
        factor = min(factor, steps // value)
        if factor < 2:
            # labelled by the flag it would set, as a measured row is (the table read "1x")
            return Skip(topic, set_flag(flag, 2 * value), f"at {set_flag(run, steps)}, {set_flag(flag, 2 * value)} would "
                        "leave the run none of this work after its first step (no evaluation or checkpoint the "
                        "script makes at that interval)")
    # labelled as the script takes it (nanoGPT's configurator reads --log_interval=10 only).
    # min_steps, the script's own interval either way: trials measuring fewer steps hold none of
    # the work on either side (word_language_model's --log-interval 20 x10, in trials of 6 steps,
    # took 11 % of the budget and read a verdict from nothing but noise; tune/admit.py skips it).
    return Candidate(topic, set_flag(flag, value * factor), {f"args.{flag['option']}": value * factor},
                     period_steps=value * factor if periodic else 0, min_steps=value)


def _too_small_to_thin(ctx: ScriptContext, phase: str, calls: str) -> str | None:
    """Why a what-if that thins a phase's calls cannot win: they took less of the baseline's
    steps than the smallest change a tune tells from noise (time_sequence_prediction's prints,
    0.004 % of its 35 s steps, took the one round an 8m budget paid for). None: worth a trial,
    or the share is unknown."""
    share = ctx.facts.phase_shares.get(phase)
    if share is None or share >= MIN_EFFECT:
        return None
    return (f"the {calls} took {share:.1%} of the baseline's steps: thinning them cannot win the "
            f"{MIN_EFFECT:.0%} a tune tells from the noise")


def log_every(ctx: ScriptContext) -> list:
    """Log less often: the script's own interval flag x10, else a what-if in which only every
    10th logging call (print, SummaryWriter, wandb) runs."""
    own = _interval_flag(ctx, "log_every", 10, periodic=True)
    if own is not None:
        return [own]
    if ctx.facts.log_calls < ctx.facts.steps // 2 or not ctx.facts.log_calls:
        return [Skip("log_every", "10", f"{ctx.facts.log_calls} logging calls in {ctx.facts.steps} steps: "
                                        "nothing per step to thin")]
    too_small = _too_small_to_thin(ctx, "log", "logging calls")
    if too_small:
        return [Skip("log_every", "every 10th call (what-if)", too_small)]
    return [Candidate("log_every", "every 10th call (what-if)", {"whatif.log_every": 10},
                      period_steps=math.ceil(10 * ctx.facts.steps / ctx.facts.log_calls))]


def checkpoint_every(ctx: ScriptContext) -> list:
    """Save less often: the script's own interval flag x4, else a what-if in which only every
    4th torch.save writes."""
    own = _interval_flag(ctx, "checkpoint_every", 4)
    if own is not None:
        return [own]  # a Candidate, or a Skip: no room in the script's run
    if not ctx.facts.save_calls:
        return [Skip("checkpoint_every", "4x", "no torch.save calls during the steps")]
    too_small = _too_small_to_thin(ctx, "ckpt", "torch.save calls")
    if too_small:
        return [Skip("checkpoint_every", "every 4th save (what-if)", too_small)]
    return [Candidate("checkpoint_every", "every 4th save (what-if)", {"whatif.save_every": 4})]


def eval_every(ctx: ScriptContext) -> list:
    """Evaluate less often: the script's own eval-interval flag x4."""
    own = _interval_flag(ctx, "eval_every", 4)
    return [own] if own else [Skip("eval_every", "4x", "the script has no eval-interval flag")]


GC_EVERY = 100


def no_gc(ctx: ScriptContext) -> list:
    """What-if: gc.collect and torch.cuda.empty_cache from the script run once every 100 calls
    (per call site): a per-step call moved under `if step % 100 == 0:`, which best.patch can
    write (patches/whatif_code.py); removing them outright could not be measured as an edit."""
    if not ctx.facts.gc_calls:
        return [Skip("no_gc", "on", "no gc.collect / empty_cache calls during the steps")]
    return [Candidate("no_gc", f"every {GC_EVERY}th gc.collect/empty_cache (what-if)", {"whatif.gc_every": GC_EVERY})]


SCRIPT_KNOBS: dict[str, Any] = {
    # Ordered by how often they pay off on scripts: with a tight budget the first ones run.
    "num_workers": num_workers,
    "log_every": log_every,
    "checkpoint_every": checkpoint_every,
    "no_gc": no_gc,
    "eval_every": eval_every,
    "precision": precision,
    "fused_optimizer": fused_optimizer,
    "zero_stage": zero_stage,
    "overlap_comm": overlap_comm,
    "bucket_size": bucket_size,
    "compile": compile,
    "attention": attention,
    "channels_last": channels_last,
    "threads": threads,
    "package_lookups": package_lookups,
    "pin_memory": pin_memory,
    "tf32": tf32,
    "cudnn_benchmark": cudnn_benchmark,
    "expandable_segments": expandable_segments,
    "persistent_workers": persistent_workers,
    "prefetch_factor": prefetch_factor,
    "padding": padding,
}
"""Knob name -> settings function. Names match `trainspeed tune --knobs K -- CMD`."""

WHATIF_PREFIX = "whatif."


def is_whatif(settings: dict[str, Any]) -> bool:
    """A what-if setting changes what the script does behind its back (skips logging calls):
    measured and reported, never kept. The script's own interval flags are real settings."""
    return any(key.startswith(WHATIF_PREFIX) for key in settings)


def parse_script_knobs(text: str | None) -> list[str]:
    """`--knobs` of a script tune (see knobs.parse_knobs)."""
    from trainspeed.tune.knobs import parse_knobs

    return parse_knobs(text, SCRIPT_KNOBS, " for a script")


def knobs_from_findings(findings: list[dict[str, Any]]) -> list[str]:
    """Knobs the doctor's findings name in their `trainspeed tune --knobs ...` commands, in
    the findings' rank order: a tune `--from RUN_DIR` measures those first."""
    from trainspeed.doctor.findings import verify_knobs

    out: list[str] = []
    for f in findings:
        for name in verify_knobs(f):
            if name in SCRIPT_KNOBS and name not in out:
                out.append(name)
    return out


__all__ = ["DS_CONFIG_PREFIX", "SCRIPT_KNOBS", "WHATIF_PREFIX", "edited_ds_config", "is_whatif", "ScriptContext",
           "knobs_from_findings", "parse_script_knobs"]
