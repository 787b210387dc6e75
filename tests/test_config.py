from __future__ import annotations

import dataclasses

import pytest
import yaml

from trainspeed.config import (
    DataConfig,
    OptimConfig,
    PrecisionConfig,
    ProfileConfig,
    TrainConfig,
    apply_overrides,
    config_hash,
    config_to_dict,
    dump_config,
    load_config,
)
from trainspeed.config_io import known_keys, split_overrides
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


def error_of(data=None, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(data or {}, overrides)
    return str(info.value)


# ----------------------------------------------------------------- validation messages


def test_range_error_names_full_key_and_value():
    assert error_of({"data": {"num_workers": -2}}) == "data.num_workers must be >= 0, got -2"
    assert error_of({"optim": {"lr": 0}}) == "optim.lr must be > 0, got 0.0"
    assert error_of({"optim": {"betas": [0.9, 1.5]}}) == "optim.betas must be two values in [0, 1), got (0.9, 1.5)"


def test_type_error_names_key_value_and_expected_type():
    assert error_of({"data": {"batch_size": "16"}}) == "data.batch_size must be int, got '16' (str)"
    assert error_of({"data": {"batch_size": True}}) == "data.batch_size must be int, got true (bool)"
    assert (
        error_of({"data": {"pin_memory": 1}})
        == "data.pin_memory must be one of 'auto', true, false, got 1 (int)"
    )
    assert error_of({"run": {"max_steps": 1.5}}) == "run.max_steps must be int or null, got 1.5 (float)"
    assert error_of({"data": 3}) == "data must be a mapping of settings, got 3 (int)"


def test_sections_validate_when_built_in_python_too():
    with pytest.raises(ConfigError, match=r"^data\.num_workers must be >= 0, got -1$"):
        DataConfig(num_workers=-1)
    with pytest.raises(ConfigError, match="optim.schedule must be one of"):
        OptimConfig(schedule="step")


def test_fp16_without_scaler_is_refused_with_reason():
    msg = error_of({"precision": {"mode": "fp16-mixed", "grad_scaler": False}})
    assert msg.startswith("precision.grad_scaler=false with precision.mode='fp16-mixed'")
    assert "underflow" in msg
    # auto resolves to a scaler exactly for fp16
    assert PrecisionConfig(mode="fp16-mixed").use_grad_scaler is True
    assert PrecisionConfig(mode="bf16-mixed").use_grad_scaler is False
    assert PrecisionConfig(mode="bf16-mixed", grad_scaler=False).use_grad_scaler is False


def test_cross_field_rules():
    assert "needs data.num_workers > 0" in error_of({"data": {"prefetch_factor": 4}})
    assert "needs data.num_workers > 0" in error_of({"data": {"persistent_workers": True}})
    load_config({"data": {"prefetch_factor": 4, "num_workers": 1, "persistent_workers": True}})
    assert "set at least one" in error_of({"run": {"max_epochs": None}})
    assert "data.bucketing=false" in error_of({"data": {"bucket_max_tokens": 4096}})


def test_device_sinks_and_profile_range():
    assert error_of({"run": {"device": "gpu"}}) == "run.device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'"
    load_config({"run": {"device": "cuda:1"}})
    msg = error_of({"logging": {"sinks": ["jsonl", "tensorbord"]}})
    assert "unknown sink 'tensorbord'" in msg and "did you mean 'tensorboard'?" in msg
    assert "without duplicates" in error_of({"logging": {"sinks": ["csv", "csv"]}})
    assert "'5-3'" in error_of({"profile": {"steps": "5-3"}})
    assert ProfileConfig(steps="50-55").step_range == (50, 55)
    assert ProfileConfig().step_range is None


# ----------------------------------------------------------------- unknown keys


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"data": {"num_worker": 4}}, "unknown setting 'data.num_worker'; did you mean 'data.num_workers'?"),
        ({"optim": {"batch_size": 4}}, "unknown setting 'optim.batch_size'; did you mean 'data.batch_size'?"),
        ({"optimizer": {}}, "unknown setting 'optimizer'; did you mean 'optim'?"),
        ({"channel_last": True}, "unknown setting 'channel_last'; did you mean 'channels_last'?"),
    ],
)
def test_unknown_keys_suggest_the_closest(data, expected):
    assert error_of(data) == expected


def test_unknown_key_without_a_close_match_has_no_suggestion():
    assert error_of({"data": {"zzzzqqq": 1}}) == "unknown setting 'data.zzzzqqq'"


def test_unknown_key_from_override_is_caught():
    assert error_of(overrides=["data.num_workrs=2"]).endswith("did you mean 'data.num_workers'?")


# ----------------------------------------------------------------- overrides & precedence


def test_override_syntaxes_all_work():
    cfg = load_config(
        {},
        ["data.num_workers=4", "--data.batch_size=8", "--optim.lr", "1e-3", "--data.shuffle", "false"],
    )
    assert cfg.data.num_workers == 4 and cfg.data.batch_size == 8
    assert cfg.optim.lr == pytest.approx(1e-3) and isinstance(cfg.optim.lr, float)
    assert cfg.data.shuffle is False


def test_yaml_bool_words_map_back_to_the_allowed_word():
    # Unquoted `off` is YAML 1.1 for false; `compile.mode=off` must still mean 'off'.
    assert load_config({}, ["compile.mode=off"]).compile.mode == "off"
    assert load_config(yaml.safe_load("compile: {mode: off}")).compile.mode == "off"
    # A bool that cannot be one of the words is still refused, with the allowed values named.
    assert "compile.mode must be one of 'off', 'default'" in error_of({"compile": {"mode": True}})


def test_override_values_are_yaml_scalars():
    out = apply_overrides(
        {"a": {"x": 1}}, ["a.n=null", "a.l=[jsonl,csv]", "a.b=true", "a.s=hello", "a.f=1.0e3", "new.k=2"]
    )
    assert out == {"a": {"x": 1, "n": None, "l": ["jsonl", "csv"], "b": True, "s": "hello", "f": 1000.0}, "new": {"k": 2}}


def test_apply_overrides_does_not_mutate_input():
    base = {"data": {"num_workers": 1}}
    apply_overrides(base, ["data.num_workers=3"])
    assert base == {"data": {"num_workers": 1}}


def test_bad_override_forms():
    with pytest.raises(ConfigError, match="must look like"):
        split_overrides(["data.num_workers"])
    with pytest.raises(ConfigError, match="has no value"):
        split_overrides(["--data.num_workers"])
    with pytest.raises(ConfigError, match="'data.batch_size' is a value"):
        apply_overrides({"data": {"batch_size": 4}}, ["data.batch_size.x=1"])


def test_precedence_cli_over_yaml_over_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"data": {"num_workers": 2, "batch_size": 64}, "optim": {"lr": "3e-4"}}))
    cfg = load_config(path, ["data.num_workers=6"])
    assert cfg.data.num_workers == 6  # CLI beats YAML
    assert cfg.data.batch_size == 64  # YAML beats default
    assert cfg.optim.lr == pytest.approx(3e-4)  # YAML 1.1 '3e-4' string accepted as float
    assert cfg.data.pad_id == DataConfig().pad_id  # default


def test_recipe_options_pass_through_unchecked():
    cfg = load_config({"recipe": {"name": "gpt"}}, ["recipe.options.n_layer=2", "recipe.options.size=tiny"])
    assert cfg.recipe.options == {"n_layer": 2, "size": "tiny"}


# ----------------------------------------------------------------- round trip, hash, defaults


def test_dump_load_round_trip_is_equal(tmp_path):
    cfg = load_config(
        {"recipe": {"name": "gpt", "options": {"size": "tiny"}}},
        ["optim.betas=[0.9,0.95]", "logging.sinks=[jsonl,csv]", "activation_checkpointing=[Block]"],
    )
    path = dump_config(cfg, tmp_path / "sub" / "config.yaml")
    again = load_config(path)
    assert again == cfg
    assert again.optim.betas == (0.9, 0.95)
    assert not list(path.parent.glob("*.tmp"))
    assert config_to_dict(again)["optim"]["betas"] == [0.9, 0.95]


def test_default_run_name_derives_from_recipe():
    assert load_config({"recipe": {"name": "gpt"}}).run.name.startswith("gpt-")
    assert TrainConfig().run.name.startswith("run-")
    assert load_config({"run": {"name": "exp1"}}).run.name == "exp1"
    assert "path separators" in error_of({"run": {"name": "a/b"}})


def test_config_hash_ignores_name_but_not_settings():
    a = load_config({"run": {"name": "a"}})
    b = load_config({"run": {"name": "b", "out_dir": "elsewhere"}})
    c = load_config({"run": {"name": "a"}, "data": {"batch_size": 33}})
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash(c)
    assert len(config_hash(a)) == 16


def test_load_config_accepts_a_config_object():
    base = load_config({"data": {"batch_size": 8}})
    derived = load_config(base, ["data.batch_size=16"])
    assert derived.data.batch_size == 16 and base.data.batch_size == 8


def test_every_field_has_a_docstring():
    """Style rule: a docstring under every field (checked in the source text)."""
    import inspect

    import trainspeed.config as config_mod
    import trainspeed.config_sections as sections_mod

    source = inspect.getsource(config_mod) + inspect.getsource(sections_mod)  # TrainConfig, its sections
    lines = source.splitlines()
    for key in known_keys(TrainConfig):
        section, _, name = key.rpartition(".")
        leaf = name
        idx = [i for i, ln in enumerate(lines) if ln.strip().startswith(f"{leaf}:")]
        assert idx, key
        assert any(lines[i + 1].strip().startswith('"""') for i in idx), f"{key} has no docstring"


def test_sections_are_slotted_kw_only():
    cfg = TrainConfig()
    assert not hasattr(cfg, "__dict__")
    for f in dataclasses.fields(cfg):
        section = getattr(cfg, f.name)
        if dataclasses.is_dataclass(section):
            assert not hasattr(section, "__dict__"), f.name
    with pytest.raises(TypeError):
        DataConfig(4)  # type: ignore[misc]
