"""A DeepSpeed script's ZeRO knobs (zero_stage, overlap_comm, bucket_size): edits of its config
JSON (`ds_config.zero_optimization.stage`). A trial runs a copy with the edits, passed through
the script's own --deepspeed_config flag (script_trials.write_ds_config); the user's file is
only read. What each knob offers is decided in zero.py, shared with the engine's knobs."""

from __future__ import annotations

from typing import Any

from trainspeed.tune.knobs import Skip
from trainspeed.tune.script_context import ScriptContext


DS_CONFIG_PREFIX = "ds_config."
"""A setting `ds_config.<key>.<key>` edits that key of the script's DeepSpeed config JSON."""


def edited_ds_config(config: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """A copy of a DeepSpeed config with the settings' ds_config.* edits (other keys ignored)."""
    import copy

    out = copy.deepcopy(config)
    for key, value in settings.items():
        if not key.startswith(DS_CONFIG_PREFIX):
            continue
        *parents, leaf = key[len(DS_CONFIG_PREFIX):].split(".")
        node = out
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = value
    return out


def _zero_of(ctx: ScriptContext, knob: str) -> Any:
    """The ZeRO settings a trial runs (zero.ZeroState: the script's JSON with the settings'
    edits, DeepSpeed's defaults filled in), or a Skip saying why the knob cannot apply."""
    from trainspeed.tune.zero import zero_state

    if ctx.facts.deepspeed is None:
        return Skip(knob, "-", "the script runs no DeepSpeed engine (no engine.step was seen)")
    f = ctx.facts.deepspeed_config
    if f is None:
        return Skip(knob, "-", "no flag of the script names its DeepSpeed config JSON (--deepspeed_config "
                               "ds.json): the tune changes ZeRO settings in a copy of that file only; a "
                               "config built in the code is yours to edit")
    if f.error:
        return Skip(knob, "-", f.error)
    return zero_state(edited_ds_config(f.config, ctx.settings).get("zero_optimization"))


def _zero_key(key: str) -> str:
    return f"{DS_CONFIG_PREFIX}zero_optimization.{key}"


def zero_stage(ctx: ScriptContext) -> list:
    """DeepSpeed ZeRO stage (0-2; 3 under memory pressure), in a copy of the script's config JSON."""
    from trainspeed.tune.zero import memory_share, stage_items

    return stage_items(_zero_of(ctx, "zero_stage"), lambda stage: {_zero_key("stage"): stage},
                       memory_share(ctx.baseline_memory, ctx.device.memory_bytes))


def overlap_comm(ctx: ScriptContext) -> list:
    """DeepSpeed's overlap_comm flipped (ZeRO >= 1), in a copy of the script's config JSON."""
    from trainspeed.tune.zero import overlap_items

    return overlap_items(_zero_of(ctx, "overlap_comm"), lambda on: {_zero_key("overlap_comm"): on})


def bucket_size(ctx: ScriptContext) -> list:
    """ZeRO's reduce/allgather bucket size, 5e7-5e8 elements (ZeRO >= 1), in a copy of the config JSON."""
    from trainspeed.tune.zero import bucket_items

    return bucket_items(_zero_of(ctx, "bucket_size"),
                        lambda n: {_zero_key("reduce_bucket_size"): n, _zero_key("allgather_bucket_size"): n})


__all__ = ["DS_CONFIG_PREFIX", "bucket_size", "edited_ds_config", "overlap_comm", "zero_stage"]
