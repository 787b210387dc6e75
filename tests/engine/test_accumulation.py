from __future__ import annotations

from collections import OrderedDict, namedtuple

import pytest
import torch
from torch import nn

from trainspeed.engine.accumulation import (
    batch_size, combine_losses, micro_batch_weights, rescale_grads_, split_batch,
)
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(60)


def _grads(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def test_weights_mean_and_tokens():
    assert micro_batch_weights([5, 7, 9], "mean") == pytest.approx([1 / 3] * 3)
    assert micro_batch_weights([1, 3], "tokens") == pytest.approx([0.25, 0.75])
    assert micro_batch_weights([4], "tokens") == [1.0]


def test_weights_from_tensors_stay_on_device_and_sum_to_one():
    w = micro_batch_weights([torch.tensor(2), torch.tensor(6), 2], "tokens")
    assert isinstance(w, torch.Tensor)
    assert w.tolist() == pytest.approx([0.2, 0.6, 0.2])


def test_weights_reject_bad_input():
    with pytest.raises(ConfigError, match="normalize='mean'"):
        micro_batch_weights([0, 0], "tokens")
    with pytest.raises(ConfigError, match="'mean' or 'tokens'"):
        micro_batch_weights([1], "sum")
    with pytest.raises(ConfigError, match="at least one"):
        micro_batch_weights([], "mean")


def test_k_micro_batches_equal_one_big_batch_mean():
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    x, y = torch.randn(12, 6), torch.randn(12, 3)
    loss_fn = nn.MSELoss()

    big = loss_fn(model(x), y)
    big.backward()
    ref = _grads(model)
    model.zero_grad()

    k = 4
    parts = split_batch((x, y), k)
    weights = micro_batch_weights([len(p[0]) for p in parts], "mean")
    losses = []
    for (xb, yb), w in zip(parts, weights):
        loss = loss_fn(model(xb), yb)
        (loss * w).backward()
        losses.append(loss)
    assert combine_losses(losses, weights).item() == pytest.approx(big.item(), rel=1e-6)
    for g, r in zip(_grads(model), ref):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def _token_loss(model, x, mask):
    """Mean squared output over the real (unmasked) tokens of a padded batch."""
    per_token = model(x).pow(2).sum(-1)  # (B, T)
    return (per_token * mask).sum() / mask.sum()


def test_token_normalized_variable_length_equals_one_big_batch():
    torch.manual_seed(1)
    model = nn.Linear(4, 2)
    lengths = [[1, 2], [7, 8], [3, 3], [5, 1]]  # micro-batches with very different token counts
    xs, masks = [], []
    for lens in lengths:
        x = torch.randn(len(lens), 8, 4)
        mask = (torch.arange(8)[None, :] < torch.tensor(lens)[:, None]).float()
        xs.append(x)
        masks.append(mask)

    big = _token_loss(model, torch.cat(xs), torch.cat(masks))
    big.backward()
    ref = _grads(model)
    model.zero_grad()

    tokens = [int(m.sum()) for m in masks]
    weights = micro_batch_weights(tokens, "tokens")
    losses = []
    for x, m, w in zip(xs, masks, weights):
        loss = _token_loss(model, x, m)
        (loss * w).backward()
        losses.append(loss)
    assert combine_losses(losses, weights).item() == pytest.approx(big.item(), rel=1e-6)
    for g, r in zip(_grads(model), ref):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)

    # The naive 1/k weighting is measurably wrong here: the test would catch a regression to it.
    model.zero_grad()
    for x, m in zip(xs, masks):
        (_token_loss(model, x, m) / len(xs)).backward()
    assert not torch.allclose(model.weight.grad, ref[0], rtol=1e-3, atol=1e-4)


def test_rescale_grads_after_summed_token_losses():
    torch.manual_seed(2)
    model = nn.Linear(3, 1)
    x = torch.randn(2, 5, 3)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]).float()
    _token_loss(model, x, mask).backward()
    ref = _grads(model)
    model.zero_grad()
    for i in range(2):  # sum over tokens per micro-batch, divide once the total is known
        (model(x[i:i + 1]).pow(2).sum(-1) * mask[i:i + 1]).sum().backward()
    rescale_grads_(model.parameters(), 1.0 / mask.sum().item())
    for g, r in zip(_grads(model), ref):
        torch.testing.assert_close(g, r)


def test_split_batch_structures():
    Pair = namedtuple("Pair", "x y")
    batch = {"x": torch.arange(10).reshape(5, 2), "pair": Pair(torch.arange(5), "tag"),
             "scale": torch.tensor(3.0), "list": [torch.zeros(5, 1)]}
    parts = split_batch(batch, 2)
    assert [p["x"].shape[0] for p in parts] == [3, 2]  # uneven: sizes differ by at most one
    assert torch.equal(torch.cat([p["x"] for p in parts]), batch["x"])
    assert isinstance(parts[1]["pair"], Pair) and parts[1]["pair"].y == "tag"
    assert parts[1]["pair"].x.tolist() == [3, 4]
    assert parts[0]["scale"] is batch["scale"]
    assert isinstance(parts[0]["list"], list) and parts[0]["list"][0].shape == (3, 1)
    od = split_batch(OrderedDict(a=torch.ones(4)), 4)
    assert len(od) == 4 and isinstance(od[0], OrderedDict) and od[0]["a"].shape == (1,)
    assert batch_size((None, torch.ones(7, 2))) == 7


def test_split_batch_errors():
    with pytest.raises(ConfigError, match="3 samples into 4"):
        split_batch(torch.ones(3, 2), 4)
    with pytest.raises(ConfigError, match="disagree"):
        split_batch((torch.ones(4), torch.ones(5)), 2)
    with pytest.raises(ConfigError, match="no tensor"):
        split_batch({"a": 1}, 2)
    with pytest.raises(ConfigError, match="k must be"):
        split_batch(torch.ones(4), 0)
