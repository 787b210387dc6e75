"""profile.steps in a Trainer config: a trace of exactly those steps, with our phase names."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainspeed.config import load_config
from trainspeed.engine.trainer import Trainer
from trainspeed.errors import ConfigError
from trainspeed.telemetry import read_run

pytestmark = pytest.mark.timeout(120)


def mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def test_engine_profile_window(tmp_path):
    data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
    cfg = {
        "run": {"out_dir": str(tmp_path), "name": "p", "max_steps": 6},
        "data": {"batch_size": 8},
        "logging": {"every": 2, "warmup_steps": 0, "progress": False},
        "checkpoint": {"save_final": False},
        "eval": {"at_end": False},
        "profile": {"steps": "3-4"},
    }
    Trainer(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1)), mse, data, config=cfg).fit()
    run_dir = tmp_path / "p"
    with open(run_dir / "profile_steps_3-4.json") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    for phase in ("data", "forward", "backward", "optimizer"):
        assert f"trainspeed.{phase}" in names, phase
    assert "trainspeed.h2d" not in names  # training on the CPU: batches are not copied
    assert sorted(n for n in names if n.startswith("trainspeed.step#")) == [
        "trainspeed.step#3", "trainspeed.step#4"]
    run = read_run(run_dir)
    assert [e["data"]["path"] for e in run.events if e["type"] == "profile"] == ["profile_steps_3-4.json"]
    assert len(run.steps) == 6


def test_profile_steps_validated_in_config():
    with pytest.raises(ConfigError, match="profile.steps"):
        load_config({"profile": {"steps": "0-3"}})
