"""`train`/`tune` targets on the command line: TARGET --help, --print-config, which target a
name means, "did you mean" for subcommands, optional extras named before the run."""

from __future__ import annotations

import sys

import pytest
import yaml

from trainspeed.cli.main import main
from trainspeed.config import config_hash, load_config
from trainspeed.engine import from_recipe

pytestmark = pytest.mark.timeout(120)


@pytest.fixture()
def no_training(monkeypatch):
    """Fail the test if a command gets as far as building a trainer."""
    def refuse(*_a, **_k):
        raise AssertionError("build_trainer was called")

    monkeypatch.setattr(from_recipe, "build_trainer", refuse)


def _row(out: str, key: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.split()[:1] == [key])
    return line.split()


@pytest.mark.parametrize("command", ["train", "tune"])
def test_help_after_a_recipe_lists_keys_values_and_meanings(command, capsys, no_training):
    assert main([command, "gpt", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"trainspeed {command} gpt: recipe gpt (fast config: ")
    assert _row(out, "data.batch_size")[:3] == ["data.batch_size", "16", "Samples"]  # fast.yaml's value
    assert _row(out, "data.num_workers")[1] == "0"
    assert _row(out, "run.name")[1] == "null"  # derived when the run starts, not frozen here
    assert _row(out, "recipe.options.size")[1] == "tiny"  # the recipe's own options, with values
    assert _row(out, "recipe.options.n_layer")[1] == "4"
    assert "recipe.options (checked by gpt):" in out
    # a key of a few values lists them (precision.mode read "Numeric precision." and no more)
    assert " ".join(_row(out, "precision.mode")[2:]).endswith("One of: fp32, tf32, bf16-mixed, fp16-mixed.")


def test_help_applies_the_variant_and_overrides(capsys, no_training):
    assert main(["train", "gpt", "--naive", "data.batch_size=3", "-h"]) == 0
    out = capsys.readouterr().out
    assert "(naive config: " in out.splitlines()[0]
    assert _row(out, "data.batch_size")[1] == "3"
    assert _row(out, "logging.every")[1] == "1"  # naive logs every step


def test_help_for_a_yaml_of_your_own_model(tmp_path, monkeypatch, capsys, no_training):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "helpmod.py").write_text("def build(config, width: int = 8, name: str = 'x'):\n    pass\n")
    (tmp_path / "my.yaml").write_text("recipe: {name: 'helpmod:build', options: {width: 32}}\n")
    try:
        assert main(["train", "my.yaml", "--help"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("trainspeed train my.yaml: config my.yaml")
        assert _row(out, "recipe.options.width")[1] == "32"
        assert _row(out, "recipe.options.name")[1] == "x"
        assert _row(out, "run.max_epochs")[1] == "1"  # a default
    finally:
        sys.modules.pop("helpmod", None)


@pytest.mark.parametrize("command", ["train", "tune"])
def test_print_config_loads_back_to_the_same_config(command, tmp_path, capsys, no_training):
    assert main([command, "gpt", "--variant", "naive", "optim.lr=0.002", "--print-config"]) == 0
    text = capsys.readouterr().out
    data = yaml.safe_load(text)
    assert data["run"]["name"] is None  # else every run of the file would share one directory
    assert data["optim"]["lr"] == 0.002 and data["logging"]["every"] == 1
    path = tmp_path / "my.yaml"
    path.write_text(text)
    expected = from_recipe.load_target("gpt", ["optim.lr=0.002"], "naive")
    loaded = load_config(path)
    # the options are written out with their defaults (a YAML to edit names them all): the same
    # options as the recipe reads them, and the rest of the config the same to the hash
    from trainspeed.recipes import get_recipe

    assert data["recipe"]["options"]["size"] == "tiny" and data["recipe"]["options"]["n_layer"] is None
    assert get_recipe("gpt").options(loaded) == get_recipe("gpt").options(expected)
    loaded.recipe.options, expected.recipe.options = {}, {}
    assert config_hash(loaded) == config_hash(expected)


def test_print_config_keeps_a_name_that_was_given(capsys, no_training):
    assert main(["train", "gpt", "--name", "exp1", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["run"]["name"] == "exp1"


def test_a_recipe_name_wins_over_a_folder_and_says_so(tmp_path, monkeypatch, capsys, no_training):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt").mkdir()
    found = from_recipe.resolve("gpt")
    assert found.kind == "recipe" and found.source.name == "fast.yaml"
    assert "./gpt is a folder, not a config file" in found.note
    assert main(["train", "gpt", "--print-config"]) == 0
    captured = capsys.readouterr()
    assert "trainspeed: 'gpt' is the built-in recipe gpt" in captured.err
    assert yaml.safe_load(captured.out)["recipe"]["name"] == "gpt"


def test_a_config_file_named_like_a_recipe_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt").write_text("recipe: {name: gpt}\ndata: {batch_size: 5}\n")
    found = from_recipe.resolve("gpt")
    assert (found.kind, found.note) == ("file", None)
    assert from_recipe.load_target("gpt").data.batch_size == 5


def test_a_folder_that_is_no_recipe_and_a_missing_yaml(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a.yaml").write_text("{}")
    (tmp_path / "mine.yaml").write_text("{}")
    assert main(["train", "configs"]) == 2
    err = capsys.readouterr().err
    assert "'configs' is a folder (it holds a.yaml), not a config file, and no recipe has that name" in err
    assert main(["train", "mnie.yaml"]) == 2
    assert "config file 'mnie.yaml' does not exist. Did you mean 'mine.yaml'?" in capsys.readouterr().err


def test_an_import_path_as_the_target(tmp_path, monkeypatch, capsys, no_training):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "tgtmod.py").write_text("def build(config, width: int = 8):\n    pass\n")
    try:
        assert main(["train", "tgtmod:build", "recipe.options.width=3", "--print-config"]) == 0
        data = yaml.safe_load(capsys.readouterr().out)
        assert data["recipe"] == {"name": "tgtmod:build", "options": {"width": 3}}
    finally:
        sys.modules.pop("tgtmod", None)


def test_a_yaml_without_a_recipe_points_at_the_own_model_form(tmp_path, capsys):
    (tmp_path / "bare.yaml").write_text("data: {batch_size: 4}\n")
    assert main(["train", str(tmp_path / "bare.yaml")]) == 2
    err = capsys.readouterr().err
    assert "recipe.name is not set" in err and "recipe: {name: mymodel:build}" in err and "docs/own-model.md" in err


def test_misspelt_subcommand_gets_did_you_mean(capsys):
    assert main(["trian", "gpt"]) == 2
    assert "unknown command 'trian'; did you mean 'train'?" in capsys.readouterr().err
    assert main(["xyzzy"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_missing_sink_extra_is_named_before_the_run(monkeypatch, capsys, no_training):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if the extra were not installed
    assert main(["train", "gpt", "--naive"]) == 2  # naive logs to console, jsonl and tensorboard
    err = capsys.readouterr().err
    assert "logging.sinks 'tensorboard' needs the 'tensorboard' package, which is not installed" in err
    assert "pip install 'trainspeed[tensorboard]'" in err
    assert "logging.sinks=[console,jsonl]" in err


def test_several_missing_extras_make_one_pip_command(monkeypatch, capsys, no_training):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert main(["tune", "gpt", "logging.sinks=[jsonl,tensorboard,wandb]"]) == 2
    assert "pip install 'trainspeed[tensorboard,wandb]'" in capsys.readouterr().err


def test_recipes_listing_says_how_to_see_keys_and_use_your_own_model(capsys):
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert "trainspeed train RECIPE --help" in out
    assert "recipe: {name: mymodel:build}" in out and "docs/own-model.md" in out
