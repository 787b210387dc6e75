"""The DeepSpeed config a strategy=deepspeed run builds (pure: no DeepSpeed needed)."""

from __future__ import annotations

import json

import pytest

from trainspeed.config import load_config
from trainspeed.engine.deepspeed_config import build_deepspeed_config, describe, zero_stage
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


def cfg(*overrides: str):
    return load_config(None, ["distributed.strategy=deepspeed", "data.batch_size=4", *overrides])


def test_the_engine_fills_batch_accumulation_precision_and_clipping():
    ds = build_deepspeed_config(cfg("accumulation.steps=2", "precision.mode=bf16-mixed", "optim.grad_clip=1.0"), 2)
    assert ds["train_micro_batch_size_per_gpu"] == 4
    assert ds["gradient_accumulation_steps"] == 2
    assert ds["train_batch_size"] == 16  # 4 x 2 accumulation x 2 ranks
    assert ds["bf16"] == {"enabled": True} and "fp16" not in ds
    assert ds["gradient_clipping"] == 1.0
    assert zero_stage(ds) == 0
    assert describe(ds, 2) == "DeepSpeed ZeRO stage 0, bf16, 2 rank(s), micro-batch 4 x 2 accumulation"


def test_fp16_uses_deepspeeds_loss_scaler_from_the_engines_initial_scale():
    ds = build_deepspeed_config(cfg("precision.mode=fp16-mixed", "precision.init_scale=1024"), 1)
    assert ds["fp16"] == {"enabled": True, "initial_scale_power": 10}


def test_a_users_json_keeps_its_own_settings_and_the_overrides_win(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 2, "overlap_comm": False,
                                                      "contiguous_gradients": True},
                                "wall_clock_breakdown": False}))
    ds = build_deepspeed_config(cfg(f"distributed.deepspeed={path}", "precision.mode=bf16-mixed",
                                    "distributed.zero_stage=1", "distributed.overlap_comm=true",
                                    "distributed.bucket_size=50000000"), 2)
    assert ds["train_micro_batch_size_per_gpu"] == 4  # "auto" (Hugging Face's style) filled in
    assert ds["zero_optimization"] == {"stage": 1, "overlap_comm": True, "contiguous_gradients": True,
                                       "reduce_bucket_size": 50000000, "allgather_bucket_size": 50000000}
    assert ds["wall_clock_breakdown"] is False


@pytest.mark.parametrize("theirs, ours, says", [
    ({"bf16": {"enabled": True}}, [], "enables bf16 but precision.mode='fp32'"),
    ({"fp16": {"enabled": True}}, ["precision.mode=bf16-mixed"], "set precision.mode=fp16-mixed"),
    ({"train_micro_batch_size_per_gpu": 8}, [], "set data.batch_size=8"),
    ({"gradient_accumulation_steps": 4}, ["accumulation.steps=2"], "set accumulation.steps=4"),
    ({"train_batch_size": 64}, [], "data.batch_size x accumulation.steps x ranks = 4 x 1 x 2 = 8 samples"),
    ({"gradient_clipping": 1.0}, [], "set optim.grad_clip=1.0"),
    ({"optimizer": {"type": "AdamW"}}, [], "move its settings there and remove the section"),
    ({"scheduler": {"type": "WarmupLR"}}, [], "optim.schedule"),
])
def test_contradictions_are_errors_that_say_which_key_to_keep(theirs, ours, says):
    with pytest.raises(ConfigError) as err:
        build_deepspeed_config(cfg(*ours, "distributed.deepspeed=" + json.dumps(theirs)), 2)
    assert says in str(err.value)


def test_inline_mapping_from_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("distributed:\n  strategy: deepspeed\n  deepspeed:\n    zero_optimization:\n      stage: 3\n")
    ds = build_deepspeed_config(load_config(str(path)), 1)
    assert zero_stage(ds) == 3


def test_bad_deepspeed_files_and_keys_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        build_deepspeed_config(cfg(f"distributed.deepspeed={tmp_path / 'missing.json'}"), 1)
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        build_deepspeed_config(cfg(f"distributed.deepspeed={bad}"), 1)
    with pytest.raises(ConfigError, match="distributed.zero_stage must be 0, 1, 2 or 3"):
        cfg("distributed.zero_stage=4")
    with pytest.raises(ConfigError, match="set distributed.strategy=deepspeed"):
        load_config(None, ["distributed.strategy=ddp", "distributed.zero_stage=2"])


def test_switches_deepspeed_does_its_own_way_are_refused_before_setup():
    from trainspeed.engine.deepspeed_engine import check_compatible

    for override, says in (("compile.mode=default", "compile.mode=default"),
                           ("batch.auto_microbatch=true", "train_micro_batch_size_per_gpu"),
                           ("nan_policy=skip", "use nan_policy=stop")):
        with pytest.raises(ConfigError, match=says):
            check_compatible(cfg(override))
    check_compatible(cfg())  # the defaults pass
