from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainspeed.config import load_config
from trainspeed.engine.data.bucketing import padded_tokens
from trainspeed.engine.data.collate import PadCollate
from trainspeed.engine.data.loader import build_dataloader
from trainspeed.engine.data.stats import batch_stats
from trainspeed.engine.from_recipe import build_trainer
from trainspeed.errors import ConfigError
from trainspeed.recipes import get_recipe, parse_options
from trainspeed.recipes.seqvae import data as sdata
from trainspeed.recipes.seqvae.metrics import active_units, collapse_metrics, kl_per_dim
from trainspeed.recipes.seqvae.model import SeqVAE, SeqVAEOptions, flops_per_token, kl_beta, vae_loss

from recipe_helpers import events, step_losses

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_thread")]


def small(**kw) -> SeqVAEOptions:
    base = dict(channels=16, layers=2, latent_dim=4, samples=64, val_samples=16, max_len=200, median_len=40)
    base.update(kw)
    return SeqVAEOptions(**base)


# ----------------------------------------------------------------- options


def test_option_errors_name_recipe_options_keys():
    with pytest.raises(ConfigError, match=r"^unknown setting 'recipe.options.latent_dims'; did you mean 'recipe.options.latent_dim'\?$"):
        parse_options(SeqVAEOptions, {"latent_dims": 8})
    with pytest.raises(ConfigError, match="recipe.options.max_len must be >= recipe.options.min_len"):
        parse_options(SeqVAEOptions, {"max_len": 10})
    with pytest.raises(ConfigError, match=r"recipe.options.median_len must be in \[min_len, max_len\]"):
        parse_options(SeqVAEOptions, {"median_len": 5000})
    with pytest.raises(ConfigError, match=r"recipe.options.kl_schedule must be one of"):
        parse_options(SeqVAEOptions, {"kl_schedule": "sigmoid"})
    with pytest.raises(ConfigError, match="recipe.options.vocab_size must be >= 4"):
        parse_options(SeqVAEOptions, {"vocab_size": 3})


# ----------------------------------------------------------------- data


def test_lengths_are_long_tailed_and_data_is_deterministic():
    o = SeqVAEOptions()
    train, val = sdata.make_datasets(o, seed=0)
    again, _ = sdata.make_datasets(o, seed=0)
    lens = train.lengths
    assert len(train) == 4096 and len(val) == 256
    assert lens.min() >= 20 and lens.max() <= 1000
    median, p99 = np.median(lens), np.percentile(lens, 99)
    assert 70 <= median <= 90 and p99 > 3 * median  # most short, a long tail
    assert 60 <= np.mean(lens) <= 130  # padding to 1000 wastes ~90% of the compute
    for i in (0, 17, 4095):
        assert torch.equal(train[i], again[i]) and len(train[i]) == lens[i]
    flat = train.flat
    assert int(flat.min()) >= sdata.FIRST_TOKEN and int(flat.max()) < o.vocab_size
    with pytest.raises(IndexError):
        train[4096]


def test_tokens_follow_style_dependent_chains():
    """The structure a VAE can learn: given the style, the next token is far more predictable."""
    o = small(samples=400, num_styles=4, vocab_size=32)
    train, _ = sdata.make_datasets(o, seed=1)
    V = o.vocab_size
    counts = np.zeros((o.num_styles, V, V))
    for i in range(len(train)):
        s = train[i].numpy()
        np.add.at(counts[train.styles[i]], (s[:-1], s[1:]), 1)

    def cond_entropy(c):
        rows = c.sum(axis=-1, keepdims=True)
        p = np.divide(c, rows, out=np.zeros_like(c), where=rows > 0)
        h = -np.sum(p * np.log(np.where(p > 0, p, 1.0)), axis=-1)
        return float((h * rows[..., 0]).sum() / rows.sum())

    with_style, without = cond_entropy(counts), cond_entropy(counts.sum(axis=0, keepdims=True))
    assert with_style < without - 0.3 and with_style < math.log(V - 2) - 1.0


@pytest.mark.parametrize("variant", ["naive", "fast"])
def test_loader_padding_figures(variant):
    """naive pads every batch to 1000 through the engine's switches; fast buckets and pads
    each batch to its longest sample. Both through build_dataloader, as in training."""
    cfg = load_config(get_recipe("seqvae").config_path(variant))
    o = get_recipe("seqvae").options(cfg)
    train, _ = sdata.make_datasets(o, seed=o.data_seed)
    bundle = build_dataloader(train, cfg.data, collate_fn=PadCollate(pad_id=0, max_seq_len=o.max_len),
                              lengths=train.lengths, seed=0)
    real = pad = samples = 0
    for ids, mask, lengths in bundle.loader:
        s = batch_stats((ids, mask, lengths))
        assert s.tokens == int(lengths.sum()) and s.samples == len(lengths)
        assert s.pad_tokens == ids.numel() - s.tokens
        if variant == "naive":
            assert ids.shape[1] == 1000
        else:
            assert ids.shape[1] == int(lengths.max())
        real, pad, samples = real + s.tokens, pad + s.pad_tokens, samples + s.samples
    assert samples == len(train) and real == int(train.lengths.sum())
    share = pad / (real + pad)
    if variant == "naive":
        assert share == pytest.approx(1 - train.lengths.mean() / 1000, abs=1e-9)
        assert share > 0.85
    else:
        plan = bundle.sampler.epoch_batches(0)
        assert (real, pad) == padded_tokens(plan, train.lengths)
        assert share < 0.12


# ----------------------------------------------------------------- model and loss


def test_kl_schedules():
    steps = torch.tensor([0, 25, 50, 99, 100, 125, 400])
    lin = kl_beta(steps, "linear", 100, 0.5)
    assert lin.tolist() == pytest.approx([0, 0.125, 0.25, 0.495, 0.5, 0.5, 0.5])
    cyc = kl_beta(steps, "cyclical", 100, 1.0)
    assert cyc.tolist() == pytest.approx([0, 0.5, 1.0, 1.0, 0.0, 0.5, 0.0])
    assert kl_beta(steps, "constant", 100, 0.7).tolist() == pytest.approx([0.7] * 7)


def test_kl_step_counts_training_forwards_and_is_checkpointed():
    torch.manual_seed(0)
    model = SeqVAE(small())
    batch = PadCollate()([torch.randint(2, 64, (n,)) for n in (20, 31, 25)])
    vae_loss(model, batch).backward()
    vae_loss(model, batch)
    with torch.no_grad():
        vae_loss(model, batch)  # no grad: not a training step
    model.eval()
    vae_loss(model, batch)
    assert int(model.kl_step) == 2
    assert int(model.state_dict()["kl_step"]) == 2  # resumes continue the schedule


def test_loss_is_recon_plus_annealed_kl_per_token():
    torch.manual_seed(0)
    model = SeqVAE(small(kl_schedule="constant", beta_max=0.5)).eval()
    ids, mask, lengths = PadCollate(max_seq_len=200, pad_to="max")([torch.randint(2, 64, (n,)) for n in (20, 45)])
    with torch.no_grad():
        logits, mu, logvar, beta = model(ids, lengths)
    ce = torch.nn.functional.cross_entropy(logits[0, :20], ids[0, :20], reduction="sum") + \
        torch.nn.functional.cross_entropy(logits[1, :45], ids[1, :45], reduction="sum")
    kl = 0.5 * (mu.pow(2) + logvar.exp() - logvar - 1).sum()
    expected = ce / 65 + 0.5 * kl / 65
    with torch.no_grad():
        assert float(vae_loss(model, (ids, mask, lengths))) == pytest.approx(float(expected), rel=1e-5)


def test_padding_does_not_change_the_result():
    torch.manual_seed(0)
    model = SeqVAE(small()).eval()
    seqs = [torch.randint(2, 64, (n,)) for n in (20, 57, 33)]
    a = PadCollate(max_seq_len=200, pad_to="max")(seqs)
    b = PadCollate()(seqs)
    with torch.no_grad():
        la, mua, _, _ = model(a[0], a[2])
        lb, mub, _, _ = model(b[0], b[2])
    assert torch.allclose(mua, mub, atol=1e-5)
    assert torch.allclose(la[:, :57], lb, atol=1e-5)
    with torch.no_grad():
        assert float(vae_loss(model, a)) == pytest.approx(float(vae_loss(model, b)), rel=1e-5)


def test_flops_per_token_formula():
    o = small()
    assert flops_per_token(o) == 6 * (2 * 2 * (3 * 16 * 16 + 16 * 16) + 16 * 64)


# ----------------------------------------------------------------- collapse metrics


def test_collapse_metrics_on_constructed_posteriors():
    n = 500
    collapsed_mu, collapsed_lv = torch.zeros(n, 8), torch.zeros(n, 8)  # q(z|x) = prior for every x
    assert active_units(collapsed_mu) == 0
    assert torch.allclose(kl_per_dim(collapsed_mu, collapsed_lv), torch.zeros(8))
    g = torch.Generator().manual_seed(0)
    mu = torch.zeros(n, 8)
    mu[:, :3] = torch.randn(n, 3, generator=g)  # 3 dims carry information
    mu[:, 3] = 0.05 * torch.randn(n, generator=g)  # variance 0.0025: below 0.01, inactive
    logvar = torch.full((n, 8), -2.0)
    assert active_units(mu) == 3
    per_dim = kl_per_dim(mu, logvar)
    expected = 0.5 * (mu.pow(2).mean(0) + math.exp(-2.0) + 2.0 - 1.0)
    assert torch.allclose(per_dim, expected)
    assert active_units(mu[:1]) == 0


def test_collapsed_model_has_no_active_units():
    torch.manual_seed(0)
    o = small()
    model = SeqVAE(o).eval()
    for layer in (model.to_mu, model.to_logvar):
        torch.nn.init.zeros_(layer.weight)
        torch.nn.init.zeros_(layer.bias)  # encoder ignores x: the posterior is the prior
    _, val = sdata.make_datasets(o, seed=0)
    loader = torch.utils.data.DataLoader(val, batch_size=8, collate_fn=PadCollate())
    m = collapse_metrics(model, loader)
    assert m["active_units"] == 0 and m["latent_dims"] == 4
    assert m["kl"] == pytest.approx(0.0, abs=1e-9) and m["kl_per_dim"] == [0.0] * 4
    assert m["recon_loss"] == pytest.approx(math.log(64), abs=0.5)  # untrained decoder
    # the same model with an informative encoder mean: units become active
    torch.nn.init.normal_(model.to_mu.weight, std=3.0)
    assert collapse_metrics(model, loader)["active_units"] > 0


# ----------------------------------------------------------------- recipe end to end


def test_loss_falls_and_collapse_metrics_reach_the_eval_events(tmp_path):
    cfg = load_config(get_recipe("seqvae").config_path("fast"), [
        "run.max_steps=30", f"run.out_dir={tmp_path}", "run.name=sv", "logging.every=1",
        "logging.progress=false", "eval.every_steps=15", "eval.limit_val_batches=2",
        "recipe.options.samples=480", "recipe.options.val_samples=32", "recipe.options.max_len=200",
        "recipe.options.median_len=50", "recipe.options.vocab_size=16", "recipe.options.channels=32",
        "recipe.options.latent_dim=8", "data.max_seq_len=200", "optim.lr=5e-3",
    ])
    trainer = build_trainer(cfg)
    trainer.fit()
    losses = step_losses(trainer.run_dir)
    assert len(losses) == 30
    first, last = np.mean(losses[:6]), np.mean(losses[-6:])
    print("seqvae losses", first, last)
    assert first > 2.5 and last < first - 0.3, (first, last)  # ln(14 data tokens) = 2.64
    evals = events(trainer.run_dir, "eval")
    # at the eval interval only, never per step (at_end reuses the step-30 evaluation); the
    # evaluation after optimizer step 15 is recorded at 15, as that step's record and checkpoint are
    assert [e["step"] for e in evals] == [15, 30]
    for e in evals:
        d = e["data"]
        assert len(d["kl_per_dim"]) == 8 and 0 <= d["active_units"] <= 8
        assert d["kl"] == pytest.approx(sum(d["kl_per_dim"]), abs=1e-4)
        assert d["recon_loss"] > 0


def test_naive_and_fast_configs_share_the_math():
    recipe = get_recipe("seqvae")
    naive, fast = (load_config(recipe.config_path(v)) for v in ("naive", "fast"))
    assert naive.recipe == fast.recipe and naive.run.max_steps == fast.run.max_steps
    assert naive.data.batch_size == fast.data.batch_size and naive.data.max_seq_len == 1000
    for key in ("lr", "weight_decay", "betas", "schedule", "warmup_steps", "grad_clip"):
        assert getattr(naive.optim, key) == getattr(fast.optim, key), key
    assert not naive.data.dynamic_padding and not naive.data.bucketing
    assert fast.data.dynamic_padding and fast.data.bucketing
