"""Which settings each knob proposes, and why it skips the rest."""

from __future__ import annotations

import pytest

from trainspeed.doctor.checks.context import TUNE_KNOBS
from trainspeed.errors import ConfigError
from trainspeed.tune.batch_size import largest_fitting
from trainspeed.tune.knobs import KNOBS, Candidate, DeviceInfo, KnobContext, Skip, parse_knobs
from trainspeed.tune.search import apply_settings


def ctx(config, device, **kw):
    return KnobContext(config=config, device=device, **kw)


def labels(items, kind=Candidate):
    return [i.label for i in items if isinstance(i, kind)]


def test_every_knob_the_doctor_names_exists():
    assert set(TUNE_KNOBS.values()) <= set(KNOBS)


def test_precision_on_cpu_measures_bf16_and_fp16_but_not_tf32(base_config, cpu):
    items = KNOBS["precision"](ctx(base_config, cpu))
    assert labels(items) == ["bf16-mixed", "fp16-mixed"]
    assert labels(items, Skip) == ["tf32"]


def test_precision_on_an_old_gpu_skips_tf32_and_bf16(base_config):
    v100 = DeviceInfo(type="cuda", cores=8, cuda_capability=(7, 0))
    items = KNOBS["precision"](ctx(base_config, v100))
    assert labels(items) == ["fp16-mixed"]
    h100 = DeviceInfo(type="cuda", cores=8, cuda_capability=(9, 0))
    assert labels(KNOBS["precision"](ctx(base_config, h100))) == ["tf32", "bf16-mixed", "fp16-mixed"]


def test_compile_modes_depend_on_device_and_compiler(base_config, cpu):
    assert labels(KNOBS["compile"](ctx(base_config, cpu))) == ["default"]
    no_cc = DeviceInfo(type="cpu", cores=2, has_compiler=False)
    assert labels(KNOBS["compile"](ctx(base_config, no_cc))) == []
    gpu = DeviceInfo(type="cuda", cores=8, cuda_capability=(9, 0))
    assert labels(KNOBS["compile"](ctx(base_config, gpu))) == ["default", "reduce-overhead", "max-autotune"]


def test_num_workers_is_searched_over_zero_to_cores(base_config):
    gpu = DeviceInfo(type="cuda", cores=8, cuda_capability=(9, 0))
    assert labels(KNOBS["num_workers"](ctx(base_config, gpu))) == ["1", "2", "4", "8"]
    six = apply_settings(base_config, {"data.num_workers": 2, "run.torch_threads": 4})
    assert labels(KNOBS["num_workers"](ctx(six, DeviceInfo(type="cpu", cores=6)))) == ["0", "1", "4", "6"]


def test_on_a_cpu_workers_are_also_tried_with_the_cores_split(base_config):
    """Workers and compute threads share a CPU's cores: each worker count is also tried with
    the rest of the cores as compute threads (the pair neither knob finds alone)."""
    items = KNOBS["num_workers"](ctx(base_config, DeviceInfo(type="cpu", cores=4)))
    split = {c.label: c.settings for c in items if "compute threads" in c.label}
    assert split == {"1 + 3 compute threads": {"data.num_workers": 1, "run.torch_threads": 3},
                     "2 + 2 compute threads": {"data.num_workers": 2, "run.torch_threads": 2}}
    assert {"data.num_workers": 4} in [c.settings for c in items]  # plain counts are still tried


def test_worker_knobs_wait_for_workers(base_config, cpu):
    items = KNOBS["persistent_workers"](ctx(base_config, cpu))
    assert isinstance(items[0], Skip) and items[0].deferred
    with_workers = apply_settings(base_config, {"data.num_workers": 2})
    assert labels(KNOBS["persistent_workers"](ctx(with_workers, cpu))) == ["true"]
    assert labels(KNOBS["prefetch_factor"](ctx(with_workers, cpu))) == ["4", "8"]


def test_pin_memory_is_a_gpu_knob(base_config, cpu):
    assert labels(KNOBS["pin_memory"](ctx(base_config, cpu))) == []
    gpu = DeviceInfo(type="cuda", cores=8, cuda_capability=(9, 0))
    assert labels(KNOBS["pin_memory"](ctx(base_config, gpu))) == ["true", "false"]


def test_batch_size_doubles_until_memory_would_not_fit(base_config):
    small = DeviceInfo(type="cuda", cores=8, cuda_capability=(9, 0), memory_bytes=10 * 2**30)
    items = KNOBS["batch_size"](ctx(base_config, small, baseline_memory=2 * 2**30))
    assert labels(items) == ["32", "64"]  # x8 would need ~16 GiB of the 8.5 usable
    assert labels(items, Skip) == ["128"]
    assert [i.cost_factor for i in items if isinstance(i, Candidate)] == [2.0, 4.0]
    assert largest_fitting({"32": True, "64": False, "128": False}) == "32"
    assert largest_fitting({"32": False}) is None


def test_grad_accumulation_keeps_the_effective_batch(base_config, cpu):
    items = KNOBS["grad_accumulation"](ctx(base_config, cpu))
    settings = [i.settings for i in items if isinstance(i, Candidate)]
    assert settings == [{"data.batch_size": 8, "accumulation.steps": 2},
                        {"data.batch_size": 4, "accumulation.steps": 4}]


def test_activation_checkpointing_needs_a_block_class(base_config, cpu):
    assert labels(KNOBS["activation_checkpointing"](ctx(base_config, cpu))) == []
    items = KNOBS["activation_checkpointing"](ctx(base_config, cpu, block_classes=["Block"]))
    assert items[0].settings == {"activation_checkpointing": ["Block"]}


def test_threads_skips_the_default(base_config, cpu):
    assert labels(KNOBS["threads"](ctx(base_config, cpu))) == ["1"]


def test_one_knob_name_for_threads_the_old_one_an_alias(capsys):
    from trainspeed.tune.knobs import parse_knobs
    from trainspeed.tune.script_knobs import SCRIPT_KNOBS, parse_script_knobs

    assert "threads" in KNOBS and "threads" in SCRIPT_KNOBS and "torch_threads" not in KNOBS
    assert parse_knobs("precision,torch_threads") == ["precision", "threads"]
    assert parse_script_knobs("torch_threads") == ["threads"]
    assert "knob 'torch_threads' is now called 'threads'" in capsys.readouterr().err


def test_log_every_and_checkpoint_every(base_config, cpu):
    noisy_log = apply_settings(base_config, {"logging.every": 1, "logging.sinks": ["console", "jsonl"]})
    assert labels(KNOBS["log_every"](ctx(noisy_log, cpu))) == ["50", "jsonl only"]
    assert labels(KNOBS["checkpoint_every"](ctx(base_config, cpu))) == []
    ckpt = apply_settings(base_config, {"checkpoint.every_steps": 10, "checkpoint.async_save": False})
    assert labels(KNOBS["checkpoint_every"](ctx(ckpt, cpu))) == ["40", "async"]


def test_every_candidate_setting_is_a_valid_config(base_config, cpu):
    from trainspeed.config import load_config

    gpu = DeviceInfo(type="cuda", cores=8, cuda_capability=(9, 0), memory_bytes=80e9)
    with_workers = apply_settings(base_config, {"data.num_workers": 2, "checkpoint.every_steps": 5})
    for device in (cpu, gpu):
        for name, fn in KNOBS.items():
            for item in fn(ctx(with_workers, device, block_classes=["Block"])):
                if isinstance(item, Candidate):
                    load_config(apply_settings(with_workers, item.settings))  # raises if invalid


def test_parse_knobs():
    assert parse_knobs(None) == list(KNOBS)
    assert parse_knobs("precision, compile,precision") == ["precision", "compile"]
    with pytest.raises(ConfigError, match="unknown knob 'precison'; did you mean 'precision'"):
        parse_knobs("precison")
    # a newcomer typed `--knobs fused`: one part of a knob's name, too short for difflib
    from trainspeed.tune.script_knobs import SCRIPT_KNOBS

    with pytest.raises(ConfigError, match="unknown knob 'fused' for a script; did you mean 'fused_optimizer'"):
        parse_knobs("fused", SCRIPT_KNOBS, kind=" for a script")


def test_block_classes_are_the_models_own_repeated_blocks():
    from trainspeed.engine.from_recipe import load_target
    from trainspeed.tune.session import find_block_classes

    cfg = load_target("gpt", ["recipe.options.size=null", "recipe.options.n_layer=2", "recipe.options.n_head=2",
                              "recipe.options.n_embd=16", "recipe.options.block_size=16",
                              "recipe.options.samples_per_epoch=64", "recipe.options.val_samples=8"], "naive")
    classes = find_block_classes(cfg)
    assert classes[0] == "Block"
    assert not {"Sequential", "ModuleList", "ModuleDict"} & set(classes)
    from trainspeed.tune.session import probe_recipe

    assert probe_recipe(cfg).steps_per_epoch == -(-64 // cfg.data.batch_size)  # 64 samples per epoch


def test_attention_tries_sdpa_for_an_eager_hugging_face_model(base_config, cpu):
    from trainspeed.config import config_to_dict, load_config

    hf = config_to_dict(load_config({"recipe": {"name": "hf", "options": {"attn_implementation": "eager"}}}))
    (cand,) = KNOBS["attention"](ctx(hf, cpu))
    assert isinstance(cand, Candidate) and cand.settings == {"recipe.options.attn_implementation": "sdpa"}
    tuned = load_config(apply_settings(hf, cand.settings))
    assert tuned.recipe.options["attn_implementation"] == "sdpa"
    already = apply_settings(hf, cand.settings)
    assert labels(KNOBS["attention"](ctx(already, cpu)), Skip) == ["sdpa"]
    (skip,) = KNOBS["attention"](ctx(base_config, cpu))  # gpt: SDPA in its own code
    assert isinstance(skip, Skip) and "attn_implementation" in skip.reason
