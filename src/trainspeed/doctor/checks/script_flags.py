"""Advice that speaks to the script: the script's own flag for a finding's setting.

The doctor records the flags the script parsed (observation "script_flags": argparse's
actions, or nanoGPT-style `--key=value` arguments read from sys.argv). A finding about the
eval interval, the log interval, num_workers or compilation names the flag the user already
has, with its current value, instead of a generic code change: `--eval_interval=10 (now
evaluating every 10 steps): pass --eval_interval=250`.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # annotations only: context.py calls script_flag (its verify commands)
    from trainspeed.doctor.checks.context import CheckContext

TOPIC_FLAGS: dict[str, tuple[str, ...]] = {
    "num_workers": ("num_workers", "workers", "n_workers", "dataloader_num_workers", "num_dataloader_workers",
                    "loader_workers", "data_workers", "j"),
    "eval_interval": ("eval_interval", "eval_every", "eval_steps", "eval_freq", "eval_every_steps",
                      "val_interval", "val_every", "val_check_interval", "validate_every", "evaluate_every",
                      "valid_interval", "test_interval"),
    "eval_iters": ("eval_iters", "eval_batches", "val_batches", "limit_val_batches", "val_steps",
                   "eval_samples", "num_eval_batches"),
    "log_interval": ("log_interval", "log_every", "log_freq", "print_freq", "print_every", "logging_steps",
                     "log_every_n_steps", "log_steps", "display_interval", "report_interval"),
    "compile": ("compile", "use_compile", "torch_compile", "compile_model", "torchcompile"),
    "checkpoint_interval": ("save_every", "save_interval", "checkpoint_every", "ckpt_every", "checkpoint_interval",
                            "save_steps", "save_freq"),
    "pin_memory": ("pin_memory", "dataloader_pin_memory", "pin_mem"),
    "logging_nan_inf_filter": ("logging_nan_inf_filter",),
    "bf16": ("bf16",),
    "amp": ("amp", "use_amp"),
    "amp_dtype": ("amp_dtype", "amp_precision"),
    "device": ("device", "accelerator"),
    "cpu_switch": ("cpu", "no_cuda", "no_accel", "no_gpu", "force_cpu"),
    "use_cpu": ("use_cpu",),
    "accumulation_steps": ("gradient_accumulation_steps", "grad_accum_steps", "accumulation_steps",
                           "accum_steps", "grad_accum", "gradient_accumulation", "accumulate_grad_batches"),
    "batch_size": ("batch_size", "per_device_train_batch_size", "train_batch_size", "micro_batch_size",
                   "batch", "bs", "b"),
    # Hugging Face's examples: `--pad_to_max_length` (no_trainer scripts: store_true; Trainer
    # scripts: a bool field, default True) pads every sample to --max_length; off, a collator pads
    # each batch to its own longest sample. TrainingArguments' --group_by_length buckets lengths.
    "pad_to_max_length": ("pad_to_max_length", "pad_to_max_len", "pad_to_max", "pad_max_length"),
    "group_by_length": ("group_by_length", "group_by_len", "bucket_by_length"),
    # how long the script runs: steps first (they scale exactly), then epochs
    "run_length": ("max_steps", "steps", "num_steps", "train_steps", "total_steps", "max_train_steps",
                   "max_iters", "iters", "iterations", "num_iterations", "n_iter", "epochs", "num_epochs",
                   "n_epochs", "max_epochs", "num_train_epochs"),
}
"""Setting -> flag names (argparse dests, lower case, '-' as '_') that hold it in scripts."""


def _norm(name: Any) -> str:
    return str(name or "").lstrip("-").lower().replace("-", "_")


def find_flag(flags: list[Any], topic: str) -> dict[str, Any] | None:
    """The flag among `flags` (rows of a "script_flags" observation) that holds `topic` (a
    TOPIC_FLAGS key), or None. Shared by the doctor's advice and the script tuner's knobs, so a
    finding names the flag the tune varies."""
    rows = [r for r in flags or [] if isinstance(r, dict)]
    if topic == "run_length":
        rows = [r for r in rows if not _counts_per(r)]
    for wanted in TOPIC_FLAGS.get(topic, ()):  # in order of preference
        for row in rows:
            if _norm(row.get("dest")) == wanted or _norm(row.get("option")) == wanted:
                return row
    # a config tree's dotted key (minGPT's --trainer.num_workers): its last part, when one key has it
    for wanted in TOPIC_FLAGS.get(topic, ()):
        dotted = [row for row in rows if _norm(row.get("dest")).rpartition(".")[1:] == (".", wanted)]
        if len(dotted) == 1:
            return dotted[0]
    return None


_PER = re.compile(r"\b(per|each)\b", re.IGNORECASE)


def _counts_per(row: dict[str, Any]) -> bool:
    """A flag whose help says it counts something per another unit is no run length: PPO's
    `--num-steps 128`, "the number of steps to run in each environment per policy rollout"
    (Lightning's examples/fabric/reinforcement_learning), which the tune raised to 406 "to
    measure the steps above", changing the rollout; its run length is --total-timesteps."""
    return bool(_PER.search(str(row.get("help") or "")))


def script_flag(ctx: CheckContext, topic: str) -> dict[str, Any] | None:
    """The script's flag for `topic` (a TOPIC_FLAGS key), as recorded, or None."""
    for obs in ctx.obs("script_flags"):
        found = find_flag(obs.get("flags") or [], topic)
        if found is not None:
            return found
    return None


def _equals_style(flag: dict[str, Any]) -> bool:
    return flag.get("kind") == "equals"


def show_flag(flag: dict[str, Any]) -> str:
    """How the script got the flag now: `--eval_interval=10`, `--workers 0`, `--compile (on)`."""
    option, value = flag.get("option") or f"--{flag.get('dest')}", flag.get("value")
    if flag.get("kind") in ("storetrue", "storefalse") or (flag.get("bare_value") is not None and value is None):
        return f"{option} ({'on' if value else 'off'})"
    return f"{option}{'=' if _equals_style(flag) else ' '}{value}"


def longer_run(flag: dict[str, Any] | None, steps: int, need: int) -> str | None:
    """The argument that makes a script which ran `steps` steps run `need`: its run-length flag
    (steps, iterations, epochs) scaled, in its own style; None without a numeric one."""
    value = flag.get("value") if flag else None
    if flag is None or not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0 or steps <= 0:
        return None
    return set_flag(flag, math.ceil(value * need / steps))


def set_flag(flag: dict[str, Any], value: Any) -> str:
    """The argument that sets the flag to `value`, in the script's own style."""
    option = flag.get("option") or f"--{flag.get('dest')}"
    if flag.get("kind") == "storetrue" or (flag.get("bare_value") is not None and value is True):
        return option if value else f"(leave out {option})"
    if flag.get("kind") == "storefalse":  # `--no_pin_memory`: giving it sets False
        return f"(leave out {option})" if value else option
    if _equals_style(flag):
        return f"{option}={value}"
    return f"{option} {value}"


BOOL_TYPES = ("bool", "string_to_bool", "str2bool")
"""argparse `type=` names of a flag that takes True/False (HfArgumentParser's string_to_bool):
run_clm.py's --torch_compile was set as `--torch_compile 1`, which worked but read as a number."""


def is_switch(flag: dict[str, Any]) -> bool:
    """Whether a flag is set on or off from the command line: store_true/store_false, a
    BooleanOptionalAction, a bool-typed value, or a bare optional value (nargs="?" with a const)."""
    return (flag.get("kind") not in ("store", "equals") or flag.get("type") in BOOL_TYPES
            or flag.get("bare_value") is not None)


def padding_flag(flags: list[Any], already_dynamic: bool) -> tuple[dict[str, Any], bool] | None:
    """(the script's flag, the value that pads less) when the script holds its padding in a flag:
    --pad_to_max_length on (off: each batch padded to its own longest sample), else, for batches
    already padded per batch, --group_by_length off (on: similar lengths batched together).
    Shared by the doctor's padding advice and the script tuner's `padding` knob, so the finding
    names the flag the tune varies. None when neither applies (or the flag is no on/off switch)."""
    pad = find_flag(flags, "pad_to_max_length")
    if pad is not None and pad.get("value") is True and not already_dynamic and is_switch(pad):
        return pad, False
    group = find_flag(flags, "group_by_length")
    if group is not None and group.get("value") is False and is_switch(group) \
            and (already_dynamic or pad is None or pad.get("value") is False):
        return group, True
    return None


def script_padding_flag(ctx: CheckContext, already_dynamic: bool) -> tuple[dict[str, Any], bool] | None:
    """padding_flag of the flags the script parsed, as recorded."""
    for obs in ctx.obs("script_flags"):
        found = padding_flag(obs.get("flags") or [], already_dynamic)
        if found is not None:
            return found
    return None


def flag_note(ctx: CheckContext, topic: str) -> str:
    """"; the script's flag: --workers 0" for an evidence line ("" when the script has none)."""
    flag = script_flag(ctx, topic)
    return f"; the script's flag: {show_flag(flag)}" if flag else ""


def eval_interval(ctx: CheckContext) -> float | None:
    """Measured steps between evaluations: the median gap between steps with eval time (None
    with fewer than two evaluations)."""
    eval_time = ctx.run.array("phases.eval")
    if eval_time.size == 0:
        return None
    steps = np.flatnonzero(np.nan_to_num(eval_time) > 0)
    if steps.size < 2:
        return None
    return float(np.median(np.diff(steps)))


def _epoch_steps(ctx: CheckContext) -> int | None:
    """Batches in one pass over the training DataLoader (its dataset's length over its batch
    size), or None where the loader did not say."""
    loader = ctx.train_loader() or {}
    size, batch = loader.get("dataset_len"), loader.get("batch_size")
    if not (isinstance(size, int) and isinstance(batch, int) and size > 0 and batch > 0):
        return None
    return size // batch if loader.get("drop_last") else -(-size // batch)


def evaluation_advice(ctx: CheckContext) -> tuple[str, str]:
    """(evidence to append, recommendation) of the evaluation finding: the measured interval
    and, when the script has them, its interval / iterations flags with their values."""
    every = eval_interval(ctx)
    interval_flag = script_flag(ctx, "eval_interval")
    iters_flag = script_flag(ctx, "eval_iters")
    evidence = ""
    if every is not None:
        evidence = f"; it runs every {every:.0f} step{'s' if round(every) != 1 else ''}" if every >= 1.5 \
            else "; it runs every step"
    if interval_flag:
        evidence += f"; the script's flag: {show_flag(interval_flag)}"
    if iters_flag:
        evidence += f", {show_flag(iters_flag)}"
    current = every if every is not None else None
    if isinstance(interval_flag and interval_flag.get("value"), (int, float)) and not isinstance(
            interval_flag.get("value"), bool):
        current = float(interval_flag["value"])
    target = 500 if current is None else max(500, int(current) * 10)
    epoch = _epoch_steps(ctx)
    parts = []
    if interval_flag:
        parts.append(f"evaluate less often: {set_flag(interval_flag, target)}")
    elif epoch is not None and current is not None and abs(current - epoch) <= 1:
        # super_resolution: a test() after each 13-step epoch was told "every 500 steps", past
        # the whole run; the interval the script has is epochs
        target = 4 * epoch
        parts.append(f"evaluate every few epochs instead of after each one (an epoch is {epoch} steps here; "
                     "the script has no flag for it, so this is a change to its loop)")
    elif current is not None and current >= 1.5:
        parts.append(f"evaluate less often than every {current:.0f} steps (every {target})")
    else:
        parts.append(f"evaluate every {target} steps instead of every step")
    if iters_flag and isinstance(iters_flag.get("value"), int) and not isinstance(iters_flag.get("value"), bool):
        parts.append(f"on fewer batches ({set_flag(iters_flag, max(1, iters_flag['value'] // 4))})")
    else:
        parts.append("on a fixed subset")
    recommendation = (", ".join(parts) + ", under torch.inference_mode() "
                      f"(engine: eval.every_steps={target})")
    return evidence, recommendation


def logging_advice(ctx: CheckContext) -> str:
    """The recommendation's lead for the logging finding: the script's log-interval flag."""
    flag = script_flag(ctx, "log_interval")
    if not flag:
        return "log every K steps instead of every step (`if step % 50 == 0:`)"
    value = flag.get("value")
    target = max(50, int(value) * 10) if isinstance(value, int) and not isinstance(value, bool) else 50
    return f"log less often: {set_flag(flag, target)} (now {show_flag(flag)})"
