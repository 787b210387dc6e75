"""The tuner's knobs: for each speed switch, which settings to try from a given config.

A knob is a plain function `(ctx) -> list[Candidate | Skip]`: the settings worth a trial on
this config and device, or why a setting is not tried (impossible on this device, already
set, needs another knob first). Settings are dotted config keys, the same keys
`trainspeed train` takes, so a winning setting is also the line that goes into best.yaml.
Knob names match the ones the doctor prints (`doctor.checks.context.TUNE_KNOBS`).
"""

from __future__ import annotations

from typing import Any

from trainspeed.errors import ConfigError

# The base types, re-exported: `from trainspeed.tune.knobs import Candidate` still works.
from trainspeed.tune.knob_types import (  # noqa: F401
    COMPILE_COST_FACTOR,
    COMPILE_STARTUP_S,
    Candidate,
    DeviceInfo,
    KnobContext,
    KnobFn,
    Skip,
)


def _powers_up_to(n: int) -> list[int]:
    values, v = [], 1
    while v < n:
        values.append(v)
        v *= 2
    values.append(n)
    return sorted(set(values))


def precision(ctx: KnobContext) -> list:
    out: list = []
    current = ctx.get("precision.mode")
    cuda = ctx.device.type == "cuda"
    cap = ctx.device.cuda_capability or (0, 0)
    for mode in ("tf32", "bf16-mixed", "fp16-mixed"):
        if mode == current:
            continue
        if mode == "tf32" and not (cuda and cap >= (8, 0)):
            out.append(Skip("precision", mode, "TF32 needs an NVIDIA GPU of compute capability 8.0+ "
                                               "(Ampere); on this device it would run plain fp32"))
        elif mode == "bf16-mixed" and cuda and cap < (8, 0):
            out.append(Skip("precision", mode, f"bf16 needs compute capability 8.0+, this GPU is {cap}"))
        else:
            # On a CPU bf16/fp16 are *allowed* and measured: with native units (AMX, AVX512-BF16)
            # they can win, without them they are emulated and far slower. The trial decides.
            out.append(Candidate("precision", mode, {"precision.mode": mode}))
    return out


def compile(ctx: KnobContext) -> list:  # noqa: A001 - the knob's name
    if ctx.get("distributed.strategy") == "deepspeed":
        return [Skip("compile", "default", "DeepSpeed's engine wraps the module, and a run with "
                                           "distributed.strategy=deepspeed keeps compile.mode=off")]
    out: list = []
    current = ctx.get("compile.mode")
    cuda = ctx.device.type == "cuda"
    for mode in ("default", "reduce-overhead", "max-autotune"):
        if mode == current:
            continue
        if not cuda and mode == "reduce-overhead":
            out.append(Skip("compile", mode, "reduce-overhead means CUDA graphs; on a CPU it is 'default'"))
        elif not cuda and mode == "max-autotune":
            out.append(Skip("compile", mode, "max-autotune benchmarks GPU kernel configs; on a CPU it "
                                             "compiles for minutes and gains what 'default' does"))
        elif not cuda and not ctx.device.has_compiler:
            out.append(Skip("compile", mode, "torch.compile on CPU needs a C++ compiler (g++/clang++) on PATH"))
        else:
            # Compilation happens in the trial's warm-up steps, which the tuner excludes.
            out.append(Candidate("compile", mode, {"compile.mode": mode}, cost_factor=COMPILE_COST_FACTOR,
                                 startup_s=COMPILE_STARTUP_S))
    return out


def attention(ctx: KnobContext) -> list:
    """A Hugging Face model's attention kernel: eager matmul-softmax-matmul vs PyTorch's fused
    scaled_dot_product_attention (the same function). Other models choose theirs in code."""
    options = ctx.get("recipe.options")
    current = options.get("attn_implementation") if isinstance(options, dict) else None
    if current is None and ctx.get("recipe.name") != "hf":
        return [Skip("attention", "sdpa", "the model has no attn_implementation option (a Hugging Face "
                                          "model has); in your own model call F.scaled_dot_product_attention")]
    if current in (None, "sdpa"):
        return [Skip("attention", "sdpa", "already sdpa")]
    return [Candidate("attention", "sdpa", {"recipe.options.attn_implementation": "sdpa"})]


def fused_optimizer(ctx: KnobContext) -> list:
    current = ctx.get("optim.implementation")
    return [Candidate("fused_optimizer", impl, {"optim.implementation": impl})
            for impl in ("fused", "foreach", "loop") if impl != current]


def batch_size(ctx: KnobContext) -> list:
    from trainspeed.tune.batch_size import batch_size_candidates

    pinned = _deepspeed_pins(ctx, "batch_size", ("train_micro_batch_size_per_gpu", "train_batch_size"))
    return pinned or batch_size_candidates(ctx)


def grad_accumulation(ctx: KnobContext) -> list:
    """Same effective batch in smaller micro-batches: a memory knob, measured for its cost."""
    pinned = _deepspeed_pins(ctx, "grad_accumulation", ("train_micro_batch_size_per_gpu",
                                                         "gradient_accumulation_steps"))
    if pinned:
        return pinned
    b, steps = int(ctx.get("data.batch_size") or 1), int(ctx.get("accumulation.steps") or 1)
    out: list = []
    for k in (2, 4):
        if b % k or b // k < 1:
            out.append(Skip("grad_accumulation", f"x{k}", f"data.batch_size={b} is not divisible by {k}"))
            continue
        out.append(Candidate("grad_accumulation", f"{b // k}x{steps * k}",
                             {"data.batch_size": b // k, "accumulation.steps": steps * k}))
    return out


def num_workers(ctx: KnobContext) -> list:
    current = int(ctx.get("data.num_workers") or 0)
    cores = max(1, ctx.device.cores)
    # Searched, not guessed: 0 and powers of two up to the core count, and the core count.
    values = [0] + _powers_up_to(cores)
    out = [Candidate("num_workers", str(n), {"data.num_workers": n}) for n in values if n != current]
    if ctx.device.type == "cpu" and ctx.get("run.torch_threads") is None:
        # On a CPU the loader workers and the compute threads share the same cores: workers
        # next to a full set of compute threads oversubscribe them (measured on convnext, 2
        # cores: 1 worker alone 0.87x, 1 compute thread alone 0.71x, the two together 1.9x).
        # So each worker count is also tried with the cores split between the two; a
        # one-knob-at-a-time ablation would never find that pair.
        out += [Candidate("num_workers", f"{n} + {cores - n} compute threads",
                          {"data.num_workers": n, "run.torch_threads": cores - n})
                for n in values if 0 < n < cores and n != current]
    return out


def _needs_workers(knob: str, label: str, ctx: KnobContext) -> Skip | None:
    if int(ctx.get("data.num_workers") or 0) == 0:
        return Skip(knob, label, "needs data.num_workers > 0; tried on top of a num_workers winner",
                    deferred=True)
    return None


def persistent_workers(ctx: KnobContext) -> list:
    if ctx.get("data.persistent_workers"):
        return [Skip("persistent_workers", "true", "already on")]
    skip = _needs_workers("persistent_workers", "true", ctx)
    return [skip] if skip else [Candidate("persistent_workers", "true", {"data.persistent_workers": True})]


def prefetch_factor(ctx: KnobContext) -> list:
    current = ctx.get("data.prefetch_factor") or 2
    out: list = []
    for f in (4, 8):
        if f == current:
            continue
        skip = _needs_workers("prefetch_factor", str(f), ctx)
        out.append(skip or Candidate("prefetch_factor", str(f), {"data.prefetch_factor": f}))
    return out


def pin_memory(ctx: KnobContext) -> list:
    if ctx.device.type != "cuda":
        return [Skip("pin_memory", "true", "pinned memory only speeds up host-to-GPU copies; "
                                           "there are none on a CPU")]
    current = ctx.get("data.pin_memory")
    return [Candidate("pin_memory", str(v).lower(), {"data.pin_memory": v})
            for v in (True, False) if v != current]


def dynamic_padding(ctx: KnobContext) -> list:
    if ctx.get("data.dynamic_padding") or ctx.get("data.bucketing"):
        return [Skip("dynamic_padding", "true", "already on (or implied by data.bucketing)")]
    return [Candidate("dynamic_padding", "true", {"data.dynamic_padding": True})]


def bucketing(ctx: KnobContext) -> list:
    if ctx.get("data.bucketing"):
        return [Skip("bucketing", "true", "already on")]
    return [Candidate("bucketing", "true", {"data.bucketing": True, "data.dynamic_padding": True})]


def channels_last(ctx: KnobContext) -> list:
    if ctx.get("channels_last"):
        return [Skip("channels_last", "true", "already on")]
    return [Candidate("channels_last", "true", {"channels_last": True})]


def activation_checkpointing(ctx: KnobContext) -> list:
    if ctx.get("activation_checkpointing"):
        return [Skip("activation_checkpointing", "on", "already on")]
    if not ctx.block_classes:
        return [Skip("activation_checkpointing", "on", "no repeated block class found in the model; "
                     "set activation_checkpointing=[YourBlock] to measure it")]
    name = ctx.block_classes[0]
    # Recomputation costs time and saves memory: a trial shows how much of each.
    return [Candidate("activation_checkpointing", name, {"activation_checkpointing": [name]})]


def threads(ctx: KnobContext) -> list:
    """torch.set_num_threads below the core count (run.torch_threads)."""
    current = ctx.get("run.torch_threads") or ctx.device.cores  # null = PyTorch's default (all cores)
    return [Candidate("threads", str(n), {"run.torch_threads": n})
            for n in _powers_up_to(max(1, ctx.device.cores)) if n != current]


def log_every(ctx: KnobContext) -> list:
    every = int(ctx.get("logging.every") or 1)
    sinks = list(ctx.get("logging.sinks") or [])
    out: list = []
    if every < 50:
        out.append(Candidate("log_every", "50", {"logging.every": 50}))
    if set(sinks) - {"jsonl"}:
        out.append(Candidate("log_every", "jsonl only", {"logging.sinks": ["jsonl"]}))
    if not out:
        out.append(Skip("log_every", "50", f"already lean (every {every} steps, sinks {sinks})"))
    return out


def checkpoint_every(ctx: KnobContext) -> list:
    every = ctx.get("checkpoint.every_steps")
    if not every:
        return [Skip("checkpoint_every", "-", "no periodic checkpoints (checkpoint.every_steps is null)")]
    out: list = [Candidate("checkpoint_every", str(every * 4), {"checkpoint.every_steps": every * 4})]
    if not ctx.get("checkpoint.async_save"):
        out.append(Candidate("checkpoint_every", "async", {"checkpoint.async_save": True}))
    return out


def _deepspeed_pins(ctx: KnobContext, knob: str, keys: tuple[str, ...]) -> list:
    """[Skip] when the config's DeepSpeed JSON fixes one of `keys` (a trial that changed the
    batch would contradict it: a ConfigError, not a measurement), else []."""
    if ctx.get("distributed.strategy") != "deepspeed":
        return []
    from trainspeed.engine.deepspeed_config import read_deepspeed_config

    ds = read_deepspeed_config(ctx.get("distributed.deepspeed"))
    fixed = [f"{k}={ds[k]!r}" for k in keys if ds.get(k) not in (None, "auto")]
    if not fixed:
        return []
    return [Skip(knob, "-", f"the DeepSpeed config fixes {', '.join(fixed)}; remove it there (the engine fills it "
                            "in from data.batch_size and accumulation.steps) to let the tune vary the batch")]


def _zero(ctx: KnobContext, knob: str) -> Any:
    """The ZeRO settings a trial of this config runs (a zero.ZeroState: the DeepSpeed config
    the engine would build, distributed.* overrides and DeepSpeed's defaults applied), or a
    Skip when the config does not run DeepSpeed."""
    strategy = ctx.get("distributed.strategy") or "none"
    if strategy != "deepspeed":
        return Skip(knob, "-", f"distributed.strategy is {strategy!r}: ZeRO settings are DeepSpeed's "
                               "(distributed.strategy=deepspeed)")
    from trainspeed.config import load_config
    from trainspeed.engine.deepspeed_config import build_deepspeed_config
    from trainspeed.tune.zero import zero_state

    # One process: a tune's trials run `trainspeed train` without a launcher (see tune/zero.py).
    return zero_state(build_deepspeed_config(load_config(ctx.config), world_size=1)["zero_optimization"])


def zero_stage(ctx: KnobContext) -> list:
    """distributed.zero_stage: the other stages of 0-2; 3 only under memory pressure (zero.stage_items)."""
    from trainspeed.tune.zero import memory_share, stage_items

    return stage_items(_zero(ctx, "zero_stage"), lambda stage: {"distributed.zero_stage": stage},
                       memory_share(ctx.baseline_memory, ctx.device.memory_bytes))


def overlap_comm(ctx: KnobContext) -> list:
    """distributed.overlap_comm flipped (ZeRO stage >= 1)."""
    from trainspeed.tune.zero import overlap_items

    return overlap_items(_zero(ctx, "overlap_comm"), lambda on: {"distributed.overlap_comm": on})


def bucket_size(ctx: KnobContext) -> list:
    """distributed.bucket_size: 5e7, 2e8, 5e8 elements but the current (ZeRO stage >= 1)."""
    from trainspeed.tune.zero import bucket_items

    return bucket_items(_zero(ctx, "bucket_size"), lambda n: {"distributed.bucket_size": n})


KNOBS: dict[str, KnobFn] = {
    # Ordered by how often they pay off: with a tight budget the first ones run.
    "precision": precision,
    "num_workers": num_workers,
    "bucketing": bucketing,
    "dynamic_padding": dynamic_padding,
    "batch_size": batch_size,
    "fused_optimizer": fused_optimizer,
    "zero_stage": zero_stage,
    "overlap_comm": overlap_comm,
    "bucket_size": bucket_size,
    "attention": attention,
    "compile": compile,
    "channels_last": channels_last,
    "log_every": log_every,
    "threads": threads,
    "pin_memory": pin_memory,
    "persistent_workers": persistent_workers,
    "prefetch_factor": prefetch_factor,
    "grad_accumulation": grad_accumulation,
    "activation_checkpointing": activation_checkpointing,
    "checkpoint_every": checkpoint_every,
}
"""Knob name -> settings function. Names match `trainspeed tune --knobs`."""

KNOB_ALIASES = {"torch_threads": "threads"}
"""Old knob name -> its name now, the same for a config and a script (still accepted, with a note)."""


def parse_knobs(text: str | None, table: dict[str, Any] | None = None, kind: str = "") -> list[str]:
    """`"precision,compile"` -> ["precision", "compile"]; None/"all" -> every knob of `table`
    (a config's KNOBS by default; the script tuner passes its own and kind=" for a script")."""
    from trainspeed.config_io import did_you_mean

    table = KNOBS if table is None else table
    if text is None or text.strip() in ("", "all"):
        return list(table)
    names = [n.strip() for n in text.split(",") if n.strip()]
    for i, name in enumerate(names):
        if name in KNOB_ALIASES and name not in table:
            import sys

            print(f"trainspeed: note: knob '{name}' is now called '{KNOB_ALIASES[name]}'", file=sys.stderr)
            names[i] = KNOB_ALIASES[name]
    for name in names:
        if name not in table:
            # a part of a knob's name ("fused" of fused_optimizer) is too short for difflib
            parts = [k for k in table if name.lower() in k.split("_") or k.startswith(name.lower())]
            guess = did_you_mean(name, list(table)) or (parts[0] if len(parts) == 1 else None)
            hint = f"did you mean '{guess}'? " if guess else ""
            raise ConfigError(f"--knobs: unknown knob '{name}'{kind}; {hint}known knobs: {', '.join(table)}")
    return list(dict.fromkeys(names))


def knob_keys(candidates: list) -> set[str]:
    return {k for c in candidates if isinstance(c, Candidate) for k in c.settings}
