from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from trainspeed.engine.memory_opts import (
    apply_activation_checkpointing, apply_channels_last, is_checkpointed, to_channels_last,
)
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(60)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(0.3)
        self.calls = 0

    def forward(self, x, *, scale=1.0):
        self.calls += 1
        return x + scale * self.fc2(self.drop(torch.tanh(self.fc1(x))))


class Net(nn.Module):
    def __init__(self, dim=6, depth=3):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x, scale=0.5)
        return self.head(x)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_checkpointing_gives_identical_gradients_and_recomputes():
    torch.manual_seed(0)
    plain = Net()
    ckpt = copy.deepcopy(plain)
    assert apply_activation_checkpointing(ckpt, ["Block"]) == 3
    x = torch.randn(4, 6)

    torch.manual_seed(123)
    plain(x).pow(2).sum().backward()
    torch.manual_seed(123)
    ckpt(x).pow(2).sum().backward()  # dropout inside: the recompute must replay its RNG
    for name, grad in _grads(plain).items():
        torch.testing.assert_close(_grads(ckpt)[name], grad, rtol=0, atol=0)
    # each block's forward ran twice (forward + recompute in backward) vs once without
    assert [b.calls for b in plain.blocks] == [1, 1, 1]
    assert [b.calls for b in ckpt.blocks] == [2, 2, 2]


def test_no_recompute_in_eval_or_no_grad():
    model = Net()
    apply_activation_checkpointing(model, ["Block"])
    with torch.no_grad():
        model(torch.randn(2, 6))
    model.eval()
    model(torch.randn(2, 6)).sum().backward()
    assert [b.calls for b in model.blocks] == [2, 2, 2]  # one per call, no recompute


def test_outermost_only_idempotent_and_deepcopy_safe():
    model = Net()
    assert apply_activation_checkpointing(model, ["Block", "Linear"]) == 4  # 3 blocks + head
    assert not is_checkpointed(model.blocks[0].fc1)  # inside a checkpointed block
    assert apply_activation_checkpointing(model, ["Block"]) == 3
    clone = copy.deepcopy(model)
    clone(torch.randn(2, 6)).sum().backward()
    assert [b.calls for b in clone.blocks] == [2, 2, 2]
    assert [b.calls for b in model.blocks] == [0, 0, 0]  # the copy does not call the original
    assert list(model.state_dict()) == list(Net().state_dict())


def test_unknown_type_lists_present_types():
    with pytest.raises(ConfigError) as info:
        apply_activation_checkpointing(Net(), ["TransformerBlock"])
    text = str(info.value)
    assert "'TransformerBlock'" in text and "Block" in text and "Linear" in text
    with pytest.raises(ConfigError, match="model itself"):
        apply_activation_checkpointing(Net(), ["Net"])
    assert apply_activation_checkpointing(Net(), []) == 0


def test_channels_last_model_and_batch():
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    x = torch.randn(2, 3, 8, 8)
    expected = conv(x)
    model = apply_channels_last(conv)
    assert model is conv
    assert conv[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not conv[0].weight.is_contiguous()
    batch = to_channels_last({"image": x, "label": torch.tensor([1, 0]), "meta": ["a", "b"]})
    assert batch["image"].is_contiguous(memory_format=torch.channels_last)
    assert batch["label"].is_contiguous() and batch["meta"] == ["a", "b"]
    torch.testing.assert_close(model(batch["image"]), expected, rtol=1e-5, atol=1e-5)
    three_d = torch.randn(3, 8, 8)
    xs = to_channels_last((x, three_d))
    assert isinstance(xs, tuple) and xs[1] is three_d  # only 4-D tensors change
    assert xs[0].is_contiguous(memory_format=torch.channels_last)
