from __future__ import annotations

import math
import os
import sysconfig
from pathlib import Path

import pytest
import torch

from trainspeed.config import load_config
from trainspeed.engine.from_recipe import build_trainer
from trainspeed.errors import ConfigError
from trainspeed.recipes import get_recipe, parse_options
from trainspeed.recipes.gpt import data as gdata
from trainspeed.recipes.hf.model import HFOptions, build_config, build_model, causal_lm_loss, flops_per_token

from recipe_helpers import step_losses

pytest.importorskip("transformers")
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_thread")]

SMALL_ROOT = Path(sysconfig.get_paths()["stdlib"]) / "json"
TINY = dict(hidden_size=32, num_layers=1, num_heads=2, block_size=32)


@pytest.fixture()
def small_corpus(cache, monkeypatch):
    monkeypatch.setattr(gdata, "stdlib_root", lambda: SMALL_ROOT)
    return cache


def test_option_errors_name_recipe_options_keys():
    with pytest.raises(ConfigError, match=r"^unknown setting 'recipe.options.hidden'; did you mean 'recipe.options.hidden_size'\?$"):
        parse_options(HFOptions, {"hidden": 32})
    with pytest.raises(ConfigError, match="recipe.options.vocab_size must be >= 256"):
        parse_options(HFOptions, {"vocab_size": 100})
    with pytest.raises(ConfigError, match="recipe.options.hidden_size must be divisible by recipe.options.num_heads"):
        parse_options(HFOptions, {"hidden_size": 30, "num_heads": 4})
    with pytest.raises(ConfigError, match=r"recipe.options.attn_implementation must be one of"):
        parse_options(HFOptions, {"attn_implementation": "flash"})
    with pytest.raises(ConfigError, match="recipe.options.model_type=.not-a-model., which is not a transformers model type"):
        build_config(HFOptions(model_type="not-a-model"))
    with pytest.raises(ConfigError, match="recipe.options.config_path=.* is neither a directory with config.json"):
        build_config(HFOptions(config_path="/nonexistent/model"))


@pytest.mark.parametrize("model_type", ["qwen2", "gpt2"])
def test_tiny_models_from_config_without_download(model_type):
    o = HFOptions(model_type=model_type, **TINY)
    torch.manual_seed(0)
    model = build_model(o)
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # the Hub is off before transformers loads
    cfg = model.config
    assert cfg.model_type == model_type and cfg.vocab_size == 256 and cfg.hidden_size == 32
    assert cfg.num_hidden_layers == 1 and cfg.num_attention_heads == 2
    assert cfg.max_position_embeddings >= 32
    x = torch.randint(0, 256, (2, 32))
    y = torch.randint(0, 256, (2, 32))
    assert model(input_ids=x).logits.shape == (2, 32, 256)
    loss = causal_lm_loss(model, (x, y))
    assert loss.item() == pytest.approx(math.log(256), abs=0.3)
    n = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is emb
    expected_n = n if tied else n - emb.numel()
    assert flops_per_token(model, 32) == 6 * expected_n + 12 * 1 * 2 * 16 * 32


def test_eager_and_sdpa_attention_compute_the_same_function():
    torch.manual_seed(0)
    eager = build_model(HFOptions(attn_implementation="eager", **TINY)).eval()
    torch.manual_seed(0)
    sdpa = build_model(HFOptions(attn_implementation="sdpa", **TINY)).eval()
    x = torch.randint(0, 256, (2, 32))
    with torch.no_grad():
        assert torch.allclose(eager(input_ids=x).logits, sdpa(input_ids=x).logits, atol=1e-4)


def test_local_config_directory(tmp_path):
    o = HFOptions(model_type="qwen2", **TINY)
    build_config(o).save_pretrained(tmp_path)
    model = build_model(HFOptions(config_path=str(tmp_path), num_layers=2))
    assert model.config.model_type == "qwen2" and model.config.num_hidden_layers == 2  # option overrides the file
    assert model.config.hidden_size == 32  # from the file
    small_vocab = HFOptions(model_type="gpt2", **TINY)
    cfg = build_config(small_vocab)
    cfg.vocab_size = 100
    cfg.save_pretrained(tmp_path / "small")
    with pytest.raises(ConfigError, match="vocab_size is 100.*set recipe.options.vocab_size=256"):
        build_config(HFOptions(config_path=str(tmp_path / "small")))


def test_loss_falls_through_the_trainer(tmp_path, small_corpus):
    cfg = load_config(get_recipe("hf").config_path("fast"), [
        "run.max_steps=30", f"run.out_dir={tmp_path}", "run.name=hf", "logging.every=1",
        "logging.progress=false", "recipe.options.hidden_size=64", "recipe.options.num_layers=1",
        "recipe.options.block_size=64", "recipe.options.samples_per_epoch=480",
        "recipe.options.val_samples=16", "data.batch_size=8", "optim.lr=3e-3", "optim.warmup_steps=3",
        "eval.limit_val_batches=2",
    ])
    trainer = build_trainer(cfg)
    summary = trainer.fit()
    losses = step_losses(trainer.run_dir)
    assert len(losses) == 30
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert first > 5.0 and last < first - 1.0, (first, last)
    assert summary["tokens_per_s"] > 0 and trainer.state.metrics["val_loss"] < first


def test_naive_and_fast_configs_share_the_math():
    recipe = get_recipe("hf")
    naive, fast = (load_config(recipe.config_path(v)) for v in ("naive", "fast"))
    n_opts, f_opts = recipe.options(naive), recipe.options(fast)
    assert (n_opts.attn_implementation, f_opts.attn_implementation) == ("eager", "sdpa")
    n_opts.attn_implementation = f_opts.attn_implementation
    assert n_opts == f_opts  # only the attention kernel differs, not the model
    for key in ("lr", "weight_decay", "betas", "schedule", "warmup_steps", "min_lr_ratio", "grad_clip"):
        assert getattr(naive.optim, key) == getattr(fast.optim, key), key
    assert naive.data.batch_size == fast.data.batch_size and naive.run.max_steps == fast.run.max_steps
