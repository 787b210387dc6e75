from __future__ import annotations

import hashlib
import random

import pytest
import torch

from trainspeed.config import load_config
from trainspeed.engine.from_recipe import build_trainer
from trainspeed.errors import ConfigError
from trainspeed.recipes import get_recipe, parse_options
from trainspeed.recipes.convnext import data as cdata
from trainspeed.recipes.convnext import synth
from trainspeed.recipes.convnext.model import (Block, ConvNeXt, ConvNeXtOptions, classification_loss,
                                               depthwise_kernel, drop_path)

from recipe_helpers import step_losses

pytest.importorskip("PIL")
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_thread")]

SMALL = dict(classes=4, per_class=6, val_per_class=2, size=48, fmt="jpeg", seed=0)


def tree_digest(root) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------- options


def test_option_errors_name_recipe_options_keys():
    with pytest.raises(ConfigError, match=r"^unknown setting 'recipe.options.dimz'; did you mean 'recipe.options.dims'\?$"):
        parse_options(ConvNeXtOptions, {"dimz": [8]})
    with pytest.raises(ConfigError, match="recipe.options.image_size must be a positive multiple of 32"):
        parse_options(ConvNeXtOptions, {"image_size": 40})
    with pytest.raises(ConfigError, match="recipe.options.depths and recipe.options.dims must be non-empty lists of equal length"):
        parse_options(ConvNeXtOptions, {"depths": [1, 1], "dims": [8, 16, 32]})
    with pytest.raises(ConfigError, match=r"recipe.options.drop_path must be in \[0, 1\), got 1.5"):
        parse_options(ConvNeXtOptions, {"drop_path": 1.5})
    with pytest.raises(ConfigError, match="recipe.options.synth_classes must be >= 2"):
        parse_options(ConvNeXtOptions, {"synth_classes": 1})
    # three stages: stride 16, so 48 is fine
    assert parse_options(ConvNeXtOptions, {"depths": [1, 1, 1], "dims": [8, 16, 32], "image_size": 48}).image_size == 48


# ----------------------------------------------------------------- synthetic folder


def test_generator_is_deterministic_and_laid_out_as_an_image_folder(tmp_path):
    a = synth.ensure_folder(tmp_path / "a", **SMALL)
    b = synth.ensure_folder(tmp_path / "b", **SMALL)
    assert a.name == b.name
    da, db = tree_digest(a), tree_digest(b)
    assert da == db and len(da) == 4 * (6 + 2)
    assert sorted({k.split("/")[0] for k in da}) == ["train", "val"]
    assert sorted({k.split("/")[1] for k in da}) == [f"class_{c:02d}" for c in range(4)]
    other = synth.ensure_folder(tmp_path / "a", **{**SMALL, "seed": 1})
    assert other != a and tree_digest(other) != da  # another seed, other pixels, other folder


def test_classes_differ_in_the_pixels():
    import numpy as np

    mean = {c: np.asarray(synth.draw(c, 64, np.random.default_rng(c)), dtype=np.float32).mean(axis=(0, 1))
            for c in (0, 5)}  # same shape, warm vs cool colour family
    assert mean[0][0] - mean[0][2] > mean[5][0] - mean[5][2] + 10


def test_interrupted_generation_leaves_no_folder(tmp_path, monkeypatch):
    real = synth.draw
    calls = []

    def flaky(c, size, rng):
        calls.append(c)
        if len(calls) == 5:
            raise KeyboardInterrupt  # e.g. Ctrl-C while generating
        return real(c, size, rng)

    monkeypatch.setattr(synth, "draw", flaky)
    with pytest.raises(KeyboardInterrupt):
        synth.ensure_folder(tmp_path, **SMALL)
    assert list(tmp_path.iterdir()) == []  # neither the final folder nor the temp dir
    monkeypatch.setattr(synth, "draw", real)
    root = synth.ensure_folder(tmp_path, **SMALL)
    assert len(tree_digest(root)) == 32 and [p.name for p in tmp_path.iterdir()] == [root.name]


def test_existing_folder_is_reused(tmp_path, monkeypatch):
    first = synth.ensure_folder(tmp_path, **SMALL)
    monkeypatch.setattr(synth, "write_folder", lambda *a, **k: pytest.fail("regenerated"))
    assert synth.ensure_folder(tmp_path, **SMALL) == first


# ----------------------------------------------------------------- user folders and transforms


def test_user_folder_with_and_without_split(tmp_path):
    src = synth.ensure_folder(tmp_path / "gen", **SMALL)
    classes, train, val = cdata.scan(src)
    assert classes == [f"class_{c:02d}" for c in range(4)]
    assert len(train) == 24 and len(val) == 8
    assert {label for _, label in val} == {0, 1, 2, 3}
    # flat layout (class folders directly in root): a seeded per-class split
    train_ds, val_ds = cdata.make_datasets(src / "train", 32, crop_scale_min=0.5, val_fraction=0.34)
    assert len(train_ds) == 16 and len(val_ds) == 8 and train_ds.classes == classes
    assert not {s[0] for s in train_ds.samples} & {s[0] for s in val_ds.samples}
    again, _ = cdata.make_datasets(src / "train", 32, crop_scale_min=0.5, val_fraction=0.34)
    assert again.samples == train_ds.samples


def test_bad_user_folders_raise_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="recipe.options.data_path=.*is not a directory"):
        cdata.scan(tmp_path / "missing")
    (tmp_path / "one" / "cats").mkdir(parents=True)
    with pytest.raises(ConfigError, match="has 1 class folder"):
        cdata.scan(tmp_path / "one")
    (tmp_path / "one" / "dogs").mkdir()
    with pytest.raises(ConfigError, match="no image files"):
        cdata.scan(tmp_path / "one")


def test_transforms_shape_range_and_seeded_augmentation(tmp_path):
    src = synth.ensure_folder(tmp_path, **SMALL)
    train, val = cdata.make_datasets(src, 32, crop_scale_min=0.35, val_fraction=0.1)
    random.seed(3)
    x, y = train[0]
    random.seed(3)
    x2, _ = train[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(x, x2)  # augmentation follows the seeded `random` stream
    assert -2.2 < float(x.min()) and float(x.max()) < 2.7  # ImageNet-normalized range
    v1, v2 = val[0][0], val[0][0]
    assert torch.equal(v1, v2)  # evaluation is deterministic
    t = cdata.TrainTransform(32, 0.35)
    for _ in range(50):
        left, top, right, bottom = t.crop_box(160, 120)
        assert 0 <= left < right <= 160 and 0 <= top < bottom <= 120


# ----------------------------------------------------------------- model


def test_depthwise_kernel_is_clamped_to_the_live_taps():
    assert [depthwise_kernel(side) for side in (1, 2, 3, 4, 8, 56)] == [1, 3, 5, 7, 7, 7]
    model = ConvNeXt(ConvNeXtOptions(image_size=32), num_classes=10)  # maps 8, 4, 2, 1
    assert [stage[0].dwconv.kernel_size for stage in model.stages] == [(7, 7), (7, 7), (3, 3), (1, 1)]
    assert ConvNeXt(ConvNeXtOptions(image_size=224), num_classes=10).stages[-1][0].dwconv.kernel_size == (7, 7)


@pytest.mark.parametrize("side", [1, 2])
def test_clamped_kernel_computes_what_the_full_kernel_does(side):
    # A 7x7 kernel on a small map: taps beyond side-1 only ever see padding. The clamped block,
    # given the full block's live centre, must match its output and its gradients.
    torch.manual_seed(0)
    full = Block(8, 0.0, 1.0, kernel_size=7)
    clamped = Block(8, 0.0, 1.0, kernel_size=depthwise_kernel(side))
    clamped.load_state_dict({k: v for k, v in full.state_dict().items() if k != "dwconv.weight"}, strict=False)
    lo = 3 - (depthwise_kernel(side) // 2)
    centre = slice(lo, 7 - lo)
    with torch.no_grad():
        clamped.dwconv.weight.copy_(full.dwconv.weight[:, :, centre, centre])
    x = torch.randn(4, 8, side, side)
    out_full, out_clamped = full(x), clamped(x)
    torch.testing.assert_close(out_clamped, out_full, rtol=1e-5, atol=1e-6)
    out_full.square().sum().backward()
    out_clamped.square().sum().backward()
    g = full.dwconv.weight.grad
    torch.testing.assert_close(clamped.dwconv.weight.grad, g[:, :, centre, centre], rtol=1e-4, atol=1e-5)
    assert g.abs().sum().item() == pytest.approx(g[:, :, centre, centre].abs().sum().item())  # dead taps: no gradient
    torch.testing.assert_close(clamped.pwconv1.weight.grad, full.pwconv1.weight.grad, rtol=1e-4, atol=1e-5)


def test_model_shapes_and_stochastic_depth():
    o = ConvNeXtOptions(depths=[1, 1, 1, 1], dims=[8, 16, 16, 32], drop_path=0.5)
    torch.manual_seed(0)
    model = ConvNeXt(o, num_classes=5)
    x = torch.randn(4, 3, 32, 32)
    assert model(x).shape == (4, 5)
    model.eval()
    assert torch.equal(model(x), model(x))  # no stochastic depth at eval
    t = torch.ones(1000, 4)
    dropped = drop_path(t, 0.25, training=True)
    kept = (dropped[:, 0] > 0).float().mean().item()
    assert 0.68 < kept < 0.82 and torch.allclose(dropped[dropped > 0], torch.tensor(1 / 0.75))
    assert torch.equal(drop_path(t, 0.25, training=False), t)
    with pytest.raises(ConfigError, match="at least 2 classes"):
        ConvNeXt(o, num_classes=1)


# ----------------------------------------------------------------- recipe end to end


def small_config(tmp_path, steps: int, variant: str = "naive"):
    recipe = get_recipe("convnext")
    return load_config(recipe.config_path(variant), [
        f"run.max_steps={steps}", f"run.out_dir={tmp_path}", "run.name=cx",
        "recipe.options.dims=[8,16,32,32]", "recipe.options.synth_classes=4",
        "recipe.options.synth_per_class=48", "recipe.options.synth_val_per_class=4",
        "recipe.options.synth_image_size=64", "recipe.options.drop_path=0.0",
        "data.batch_size=16", "logging.every=1", "logging.sinks=[jsonl]", "logging.progress=false",
        "eval.limit_val_batches=1", "optim.warmup_steps=3",
    ])


def test_loss_falls_through_the_trainer(tmp_path, cache):
    cfg = small_config(tmp_path, steps=45)
    trainer = build_trainer(cfg)
    summary = trainer.fit()
    losses = step_losses(trainer.run_dir)
    assert len(losses) == 45
    first, last = sum(losses[:6]) / 6, sum(losses[-6:]) / 6
    assert first > 1.2 and last < 0.85 * first, (first, last)  # 4 classes: ln 4 = 1.39 at the start
    assert 0.0 <= trainer.state.metrics["val_accuracy"] <= 1.0
    assert summary["samples_per_s"] > 0


def test_naive_and_fast_configs_share_the_math():
    recipe = get_recipe("convnext")
    naive, fast = (load_config(recipe.config_path(v)) for v in ("naive", "fast"))
    assert naive.recipe == fast.recipe and naive.run.max_steps == fast.run.max_steps
    assert naive.data.batch_size == fast.data.batch_size and naive.run.seed == fast.run.seed
    for key in ("lr", "weight_decay", "betas", "schedule", "warmup_steps", "min_lr_ratio", "grad_clip"):
        assert getattr(naive.optim, key) == getattr(fast.optim, key), key
    assert naive.data.num_workers == 0 and naive.logging.every == 1 and not naive.channels_last
    recipe.options(fast)
