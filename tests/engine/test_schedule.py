from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from trainspeed.engine.schedule import build_scheduler, lr_factor
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


def test_warmup_is_linear_and_reaches_peak():
    assert [lr_factor(s, 4, 100, "constant") for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_constant_without_total():
    assert lr_factor(10_000, 0, None, "constant") == 1.0


def test_cosine_numbers():
    # warmup 2, total 12: decay over steps 2..11 (span 9)
    assert lr_factor(2, 2, 12, "cosine") == pytest.approx(1.0)
    mid = 2 + 4.5  # progress 0.5 -> halfway between peak and min
    assert lr_factor(int(mid), 2, 12, "cosine", 0.1) == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 9)))
    assert lr_factor(11, 2, 12, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_factor(50, 2, 12, "cosine", 0.1) == pytest.approx(0.1)  # clamped after the end


def test_linear_numbers():
    assert [round(lr_factor(s, 0, 5, "linear"), 6) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert lr_factor(4, 0, 5, "linear", 0.2) == pytest.approx(0.2)
    assert lr_factor(2, 0, 5, "linear", 0.2) == pytest.approx(0.6)


def test_degenerate_lengths():
    assert lr_factor(0, 0, 1, "cosine", 0.3) == pytest.approx(0.3)  # one step: ends at min
    assert lr_factor(3, 5, 4, "cosine") == pytest.approx(0.8)  # run ends inside warm-up


def test_errors():
    with pytest.raises(ConfigError, match="run.max_steps"):
        lr_factor(0, 0, None, "cosine")
    with pytest.raises(ConfigError, match="optim.schedule"):
        lr_factor(0, 0, 10, "step")
    with pytest.raises(ConfigError, match="min_lr_ratio"):
        lr_factor(0, 0, 10, "linear", 1.5)


def test_build_scheduler_drives_the_optimizer_lr():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.5)
    cfg = SimpleNamespace(schedule="linear", warmup_steps=2, min_lr_ratio=0.0)
    sched = build_scheduler(opt, cfg, total_steps=6)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.25, 0.5, 0.5, 0.5 * 2 / 3, 0.5 / 3, 0.0])


def test_build_scheduler_fails_at_setup_without_total():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ConfigError, match="total number of steps"):
        build_scheduler(opt, SimpleNamespace(schedule="cosine", warmup_steps=10, min_lr_ratio=0.0), None)
    build_scheduler(opt, SimpleNamespace(schedule="constant", warmup_steps=10, min_lr_ratio=0.0), None)
