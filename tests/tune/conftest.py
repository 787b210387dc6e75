"""Fixtures of the tune tests: a small gpt config and a 2-core CPU."""

from __future__ import annotations

import pytest

from trainspeed.config import config_to_dict, load_config
from trainspeed.tune.knobs import DeviceInfo


@pytest.fixture
def base_config():
    cfg = load_config({"recipe": {"name": "gpt"}, "run": {"max_steps": 30, "max_epochs": None},
                       "data": {"batch_size": 16}, "optim": {"implementation": "loop"}})
    return config_to_dict(cfg)


@pytest.fixture
def cpu():
    return DeviceInfo(type="cpu", cores=2, memory_bytes=8e9, has_compiler=True)
