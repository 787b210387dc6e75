from __future__ import annotations

import math
import pickle
import sysconfig
from pathlib import Path

import pytest
import torch

from trainspeed.config import load_config
from trainspeed.errors import ConfigError
from trainspeed.recipes import get_recipe, list_recipes, parse_options, register_recipe
from trainspeed.recipes.gpt import batch_stats
from trainspeed.recipes.gpt import data as gdata
from trainspeed.recipes.gpt.model import GPT, GPTOptions, count_params, flops_per_token, lm_loss

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_thread")]

# A small real corpus: the stdlib's json package (a few .py files, ~100 KB).
SMALL_ROOT = Path(sysconfig.get_paths()["stdlib"]) / "json"


def tiny_options(**kw) -> GPTOptions:
    base = dict(size=None, n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.0)
    base.update(kw)
    return GPTOptions(**base)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(gdata.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(gdata, "stdlib_root", lambda: SMALL_ROOT)
    return tmp_path / "cache"


# ----------------------------------------------------------------- options


def test_presets_and_explicit_values():
    o = parse_options(GPTOptions, {"size": "gpt2"})
    assert (o.n_layer, o.n_head, o.n_embd) == (12, 12, 768)
    o = parse_options(GPTOptions, {"size": "tiny", "n_layer": 2})
    assert (o.n_layer, o.n_head, o.n_embd) == (2, 4, 128)


def test_option_errors_name_recipe_options_keys():
    with pytest.raises(ConfigError, match=r"^unknown setting 'recipe.options.n_layr'; did you mean 'recipe.options.n_layer'\?$"):
        parse_options(GPTOptions, {"n_layr": 2})
    with pytest.raises(ConfigError, match="recipe.options.n_embd must be divisible by recipe.options.n_head"):
        parse_options(GPTOptions, {"n_embd": 100, "n_head": 3})
    with pytest.raises(ConfigError, match=r"recipe.options.block_size must be int, got '8' \(str\)"):
        parse_options(GPTOptions, {"block_size": "8"})
    with pytest.raises(ConfigError, match="recipe.options.n_layer is not set and recipe.options.size is null"):
        parse_options(GPTOptions, {"size": None})


def test_gpt2_preset_is_124m_with_gpt2_vocabulary():
    assert 124.0e6 < count_params(GPTOptions(size="gpt2", vocab_size=50257, block_size=1024), False) < 124.7e6


@pytest.mark.parametrize("bias", [False, True])
def test_count_params_matches_the_model(bias):
    o = tiny_options(bias=bias)
    model = GPT(o)
    assert count_params(o, False) == model.num_params(non_embedding=False) == sum(p.numel() for p in model.parameters())
    assert count_params(o) == model.num_params()


@pytest.fixture()
def one_thread():
    # Intra-op threads spin-wait; on a small shared CI box two threads can be 10x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----------------------------------------------------------------- model


def test_forward_shapes_and_weight_tying():
    torch.manual_seed(0)
    model = GPT(tiny_options())
    idx = torch.randint(0, 256, (3, 16))
    assert model(idx).shape == (3, 16, 256)
    assert model(idx[:, :5]).shape == (3, 5, 256)
    assert model.lm_head.weight is model.wte.weight
    with pytest.raises(ValueError, match="exceeds block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_causal_mask_future_tokens_do_not_change_earlier_logits():
    torch.manual_seed(0)
    model = GPT(tiny_options()).eval()
    idx = torch.randint(0, 256, (2, 16))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 7) % 256
    a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 10], b[:, 10])


def test_init_is_gpt2_style():
    torch.manual_seed(0)
    model = GPT(GPTOptions(size="small", block_size=64))
    std = model.h[0].mlp.c_proj.weight.std().item()
    assert std == pytest.approx(0.02 / math.sqrt(2 * 6), rel=0.05)
    assert model.h[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    # initial loss is close to uniform over bytes: ln(256) = 5.55
    x, y = torch.randint(0, 256, (2, 4, 64))
    assert lm_loss(model, (x, y)).item() == pytest.approx(math.log(256), abs=0.15)


def test_flops_per_token_formula():
    o = tiny_options()
    model = GPT(o)
    n = sum(p.numel() for p in model.parameters()) - o.block_size * o.n_embd
    assert model.num_params() == n
    assert flops_per_token(model) == 6 * n + 12 * 2 * 2 * 16 * 16


def test_tiny_gpt_loss_falls_in_50_steps(cache):
    torch.manual_seed(0)
    train, _ = gdata.make_datasets(block_size=64, samples_per_epoch=50 * 16, val_samples=16)
    model = GPT(tiny_options(n_embd=64, n_head=4, block_size=64))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = torch.utils.data.DataLoader(train, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
    losses = []
    for batch in loader:
        loss = lm_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert len(losses) == 50
    assert losses[0] > 5.0
    assert sum(losses[-5:]) / 5 < 3.2


# ----------------------------------------------------------------- data


def test_source_files_sorted_and_skip_installed_packages(tmp_path):
    for rel in ("b.py", "a/z.py", "a/y.txt", "site-packages/x.py", "__pycache__/c.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    names = [p.relative_to(tmp_path).as_posix() for p in gdata.source_files(tmp_path)]
    assert names == ["a/z.py", "b.py"]


def test_dataset_items_are_deterministic_shifted_windows(cache):
    train, val = gdata.make_datasets(block_size=32, samples_per_epoch=100, val_samples=10)
    train2, _ = gdata.make_datasets(block_size=32, samples_per_epoch=100, val_samples=10)
    tokens = gdata.load_tokens().read_bytes()
    split = int(len(tokens) * 0.9)
    for i in (0, 1, 57, 99):
        x, y = train[i]
        x2, y2 = train2[i]
        assert torch.equal(x, x2) and torch.equal(y, y2)
        assert x.dtype == torch.int64 and x.shape == (32,)
        assert torch.equal(x[1:], y[:-1])
        o = train.offset(i)
        assert 0 <= o and o + 33 <= split
        assert bytes(x.tolist()) == tokens[o : o + 32]
    assert all(split <= val.offset(i) for i in range(10))
    assert len({train.offset(i) for i in range(100)}) > 90  # offsets spread, not one window
    with pytest.raises(IndexError):
        train[100]


def test_dataset_pickles_without_the_memory_map(cache):
    train, _ = gdata.make_datasets(block_size=32, samples_per_epoch=10, val_samples=4)
    x, _ = train[3]  # opens the map
    assert train._tokens is not None
    blob = pickle.dumps(train)
    assert len(blob) < 2000
    again = pickle.loads(blob)
    assert again._tokens is None and torch.equal(again[3][0], x)


def test_cache_is_reused_without_retokenizing(cache, monkeypatch):
    calls = []
    real = gdata.tokenize
    monkeypatch.setattr(gdata, "tokenize", lambda root, out: calls.append(out) or real(root, out))
    first = gdata.load_tokens()
    second = gdata.load_tokens()
    assert first == second and len(calls) == 1
    assert first.parent == cache
    assert first.stat().st_size == sum(p.stat().st_size + 1 for p in gdata.source_files(SMALL_ROOT))
    assert f"{__import__('sys').version_info.minor}" in first.name  # keyed by Python version


def test_interrupted_tokenize_leaves_no_half_written_cache(cache, monkeypatch):
    real_read = gdata.read_source
    seen = []

    def flaky(path):
        seen.append(path)
        if len(seen) == 3:
            raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of tokenizing
        return real_read(path)

    monkeypatch.setattr(gdata, "read_source", flaky)
    with pytest.raises(KeyboardInterrupt):
        gdata.load_tokens()
    target = gdata.cache_path(SMALL_ROOT)
    assert not target.exists()
    assert list(cache.iterdir()) == []  # the temp file was removed too
    monkeypatch.setattr(gdata, "read_source", real_read)
    assert gdata.load_tokens().stat().st_size > 0


# ----------------------------------------------------------------- recipe & registry


def test_recipe_build_gives_working_parts(cache):
    cfg = load_config({"recipe": {"name": "gpt", "options": {"size": None, "n_layer": 1, "n_head": 2,
                                                             "n_embd": 32, "block_size": 32,
                                                             "samples_per_epoch": 64}}})
    recipe = get_recipe("gpt")
    parts = recipe.build(cfg)
    again = recipe.build(cfg)
    assert len(parts.train_data) == 64 and parts.val_data is not None
    for a, b in zip(parts.model.parameters(), again.model.parameters()):
        assert torch.equal(a, b)  # seeded init, independent of the global RNG
    batch = torch.utils.data.default_collate([parts.train_data[i] for i in range(4)])
    stats = parts.batch_stats(batch)
    assert (stats.samples, stats.tokens, stats.pad_tokens) == (4, 128, 0)
    loss = parts.loss_fn(parts.model, batch)
    assert loss.ndim == 0 and loss.item() == pytest.approx(math.log(256), abs=0.2)
    assert parts.flops_per_token == flops_per_token(parts.model)


def test_naive_and_fast_configs_load_and_share_the_math():
    recipe = get_recipe("gpt")
    naive = load_config(recipe.config_path("naive"))
    fast = load_config(recipe.config_path("fast"))
    assert naive.recipe == fast.recipe and naive.run.max_steps == fast.run.max_steps
    assert naive.run.seed == fast.run.seed and naive.data.batch_size == fast.data.batch_size
    for key in ("lr", "weight_decay", "betas", "schedule", "warmup_steps", "min_lr_ratio", "grad_clip"):
        assert getattr(naive.optim, key) == getattr(fast.optim, key), key
    assert naive.precision.mode == fast.precision.mode == "fp32"
    assert naive.data.num_workers == 0 and naive.logging.every == 1
    assert fast.logging.every == 50 and fast.logging.sinks == ["jsonl"]
    assert fast.optim.implementation == "auto" and naive.optim.implementation == "loop"
    recipe.options(naive)  # recipe options validate
    with pytest.raises(ConfigError, match="no variant 'slow'"):
        recipe.config_path("slow")


def test_registry_unknown_name_suggests_and_lists():
    with pytest.raises(ConfigError, match=r"unknown recipe 'gtp'; did you mean 'gpt'\? available recipes: .*gpt"):
        get_recipe("gtp")
    assert "gpt" in [r.name for r in list_recipes()]


def test_register_recipe_object(monkeypatch):
    from trainspeed.recipes import registry

    monkeypatch.setattr(registry, "_RECIPES", dict(registry._RECIPES))
    monkeypatch.setattr(registry, "_LOADED", dict(registry._LOADED))

    class Dummy:
        name = "dummy-test"
        description = "d"

        def build(self, config):
            raise NotImplementedError

        def config_path(self, variant):
            return Path(variant)

    register_recipe("dummy-test", Dummy())
    assert get_recipe("dummy-test").description == "d"
    assert "dummy-test" in registry.recipe_names()
    with pytest.raises(ConfigError, match="must look like"):
        register_recipe("x", "no_colon")


def test_batch_stats_counts_tokens():
    x = torch.zeros(5, 7, dtype=torch.long)
    s = batch_stats((x, x))
    assert (s.samples, s.tokens, s.pad_tokens) == (5, 35, 0)
