"""Small shared helpers for the checkpoint tests (a unique module name, not a conftest)."""

from __future__ import annotations

import torch


def tiny_model(hidden: int = 8) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2))
