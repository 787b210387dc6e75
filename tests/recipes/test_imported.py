"""Your own model as a recipe: `recipe.name: module:attr` (recipes/imported.py)."""

from __future__ import annotations

import itertools
import sys
import textwrap

import pytest

from trainspeed.config import load_config
from trainspeed.errors import ConfigError
from trainspeed.recipes import RecipeParts, get_recipe

pytestmark = pytest.mark.timeout(120)

_count = itertools.count()

MODEL = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset
from trainspeed.recipes import RecipeParts


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def build(config, width: int = 8, samples: int = 64, tags: list = []):
    torch.manual_seed(config.run.seed)
    x = torch.randn(samples, 4)
    model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))
    return RecipeParts(model=model, loss_fn=loss_fn, train_data=TensorDataset(x, (x[:, 0] > 0).long()))


def needs_depth(depth: int):
    return None


def broken(config):
    raise ValueError("no data at /nowhere")


def wrong_type(config):
    return (1, 2)


class MyRecipe:
    """A recipe class with its own options."""

    def options(self, config):
        unknown = set(config.recipe.options) - {"width"}
        if unknown:
            raise ConfigError(f"unknown setting 'recipe.options.{unknown.pop()}'")
        return config.recipe.options

    def build(self, config):
        return build(config, **config.recipe.options)


from trainspeed.errors import ConfigError
'''


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
    """Write a module into tmp_path (the cwd, not on sys.path); return a factory of its name."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    names: list[str] = []

    def write(source: str = MODEL, stem: str = "usermod") -> str:
        name = f"{stem}_{next(_count)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


def cfg_for(name: str, **options):
    return load_config({"recipe": {"name": name, "options": options},
                        "run": {"max_steps": 2, "max_epochs": None, "device": "cpu", "out_dir": "runs"},
                        "logging": {"progress": False}, "data": {"batch_size": 8}})


def test_function_recipe_builds_from_the_cwd_with_its_options(user_module):
    mod = user_module()
    assert mod not in sys.modules
    cfg = cfg_for(f"{mod}:build", width=16)
    recipe = get_recipe(cfg.recipe.name)
    parts = recipe.build(cfg)
    assert isinstance(parts, RecipeParts)
    assert parts.model[0].out_features == 16  # the option reached build(width=16)
    assert len(parts.train_data) == 64  # the default of samples
    opts = recipe.options(cfg)
    assert (opts.width, opts.samples, opts.tags) == (16, 64, [])


def test_function_recipe_trains_through_build_trainer(user_module, tmp_path):
    from trainspeed.engine.from_recipe import build_trainer

    mod = user_module()
    cfg = cfg_for(f"{mod}:build")
    trainer = build_trainer(cfg)
    trainer.fit()
    assert cfg.run.name.startswith(f"{mod}-build-")  # no colon in the run directory's name
    assert (tmp_path / "runs" / cfg.run.name / "steps.jsonl").is_file()


def test_options_are_checked_like_config_keys(user_module):
    mod = user_module()
    recipe = get_recipe(f"{mod}:build")
    with pytest.raises(ConfigError, match=r"unknown setting 'recipe.options.widht'; did you mean 'recipe.options.width'\?"):
        recipe.options(cfg_for(f"{mod}:build", widht=3))
    with pytest.raises(ConfigError, match=r"recipe.options.width must be int, got 'wide' \(str\)"):
        recipe.options(cfg_for(f"{mod}:build", width="wide"))
    with pytest.raises(ConfigError, match=r"recipe.options.depth: required by .*:needs_depth"):
        get_recipe(f"{mod}:needs_depth").options(cfg_for(f"{mod}:needs_depth"))


def test_a_build_function_whose_config_parameter_is_called_cfg_is_told_its_name(user_module):
    """`def build(cfg, hidden=8)`: "recipe.options.cfg: required by ...", as if cfg were an option."""
    mod = user_module("def build(cfg, hidden: int = 8):\n    pass\n")
    with pytest.raises(ConfigError, match=r"build\(cfg, \.\.\.\): the parameter that receives the TrainConfig "
                                          r"must be called config; rename cfg to config"):
        get_recipe(f"{mod}:build")
    # a first parameter that is an option (it has a default, or config comes too) is one
    assert get_recipe(user_module("def build(c=1, config=None):\n    pass\n") + ":build")


def test_a_file_name_or_a_path_into_a_function_is_told_the_target_form(user_module):
    mod = user_module()
    with pytest.raises(ConfigError, match=rf"write the module, not its file: did you mean '{mod}:build'\?"):
        get_recipe(f"{mod}.py:build")
    with pytest.raises(ConfigError, match=rf"'build' in module '{mod}' is a function, which has no 'x'; the target "
                                          rf"is 'module:function' \(e.g. '{mod}:build'\)"):
        get_recipe(f"{mod}:build.x")


def test_recipe_class_is_made_and_its_options_method_used(user_module):
    mod = user_module()
    recipe = get_recipe(f"{mod}:MyRecipe")
    assert recipe.description == "A recipe class with its own options."
    assert recipe.build(cfg_for(f"{mod}:MyRecipe", width=4)).model[0].out_features == 4
    with pytest.raises(ConfigError, match="recipe.options.depth"):
        recipe.options(cfg_for(f"{mod}:MyRecipe", depth=4))
    with pytest.raises(ConfigError, match="ships no 'naive' config"):
        recipe.config_path("naive")


def test_module_not_found_names_the_path_and_where_it_looked(user_module, tmp_path):
    with pytest.raises(ConfigError) as err:
        get_recipe("no_such_module_xyz.models:build")
    text = str(err.value)
    assert text.startswith("recipe.name='no_such_module_xyz.models:build': module 'no_such_module_xyz.models' not found")
    assert str(tmp_path) in text and "PYTHONPATH" in text


def test_a_missing_dependency_of_the_module_is_not_called_module_not_found(user_module):
    mod = user_module("import not_installed_dep_xyz\n")
    with pytest.raises(ConfigError, match=rf"module '{mod}' was found but failed to import: it imports "
                                          r"'not_installed_dep_xyz', which is not installed"):
        get_recipe(f"{mod}:build")


def test_module_raising_at_import_says_where(user_module, tmp_path):
    mod = user_module("x = 1\ny = undefined_name\n")
    with pytest.raises(ConfigError, match=rf"importing module '{mod}' raised NameError: .*undefined_name.*"
                                          rf"\(at .*{mod}\.py:2 in <module>\)"):
        get_recipe(f"{mod}:build")


def test_missing_attribute_suggests_and_lists(user_module):
    mod = user_module()
    with pytest.raises(ConfigError, match=rf"recipe.name='{mod}:buld': module '{mod}' \(.*{mod}\.py\) has no "
                                          r"attribute 'buld'; did you mean 'build'\? it defines: .*MyRecipe"):
        get_recipe(f"{mod}:buld")


def test_factory_raising_is_a_config_error_at_the_users_line(user_module):
    mod = user_module()
    cfg = cfg_for(f"{mod}:broken")
    with pytest.raises(ConfigError, match=rf"recipe.name='{mod}:broken': broken\(\.\.\.\) raised ValueError: "
                                          rf"no data at /nowhere \(at .*{mod}\.py:\d+ in broken\)") as err:
        get_recipe(cfg.recipe.name).build(cfg)
    assert isinstance(err.value.__cause__, ValueError)  # the traceback stays chained


def test_factory_returning_something_else_is_refused(user_module):
    mod = user_module()
    cfg = cfg_for(f"{mod}:wrong_type")
    with pytest.raises(ConfigError, match=r"returned tuple; it must return trainspeed.recipes.RecipeParts"):
        get_recipe(cfg.recipe.name).build(cfg)


def test_malformed_import_paths_and_dotted_names():
    with pytest.raises(ConfigError, match=r"recipe.name must be a recipe name or an import path 'module:attr'"):
        load_config({"recipe": {"name": "my-model:build"}})
    with pytest.raises(ConfigError, match=r"unknown recipe 'mypkg.models.build'.*did you mean 'mypkg.models:build'\?"):
        get_recipe("mypkg.models.build")
    with pytest.raises(ConfigError, match=r"unknown recipe 'gtp'; did you mean 'gpt'\?.*mymodel:build"):
        get_recipe("gtp")


def test_options_given_to_a_recipe_without_an_options_method_are_refused(user_module):
    mod = user_module(MODEL + "\n\nclass Plain:\n    def build(self, config):\n        return build(config)\n")
    cfg = cfg_for(f"{mod}:Plain", width=4)
    with pytest.raises(ConfigError, match=r"recipe.options.width: the recipe .* has no options\(\) method"):
        get_recipe(cfg.recipe.name).build(cfg)
    assert isinstance(get_recipe(cfg.recipe.name).build(cfg_for(f"{mod}:Plain")), RecipeParts)


def test_an_import_path_target_has_no_naive_variant(user_module):
    from trainspeed.engine.from_recipe import resolve

    mod = user_module()
    assert resolve(f"{mod}:build").source == {"recipe": {"name": f"{mod}:build"}}
    with pytest.raises(ConfigError, match=r"ships no 'naive' config; write a YAML"):
        resolve(f"{mod}:build", "naive")
