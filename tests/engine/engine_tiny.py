"""A tiny regression the Trainer's stop, resume and full-disk tests train: 64 samples of 6
features, their sum the target; a seeded two-layer MLP."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset


def tiny_data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 6, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))


def mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)
