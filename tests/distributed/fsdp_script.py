"""A tiny Trainer script for the FSDP tests, launched by torchrun (not collected by pytest).

    torchrun --nproc_per_node 2 fsdp_script.py OUT_DIR NAME [key=value ...]

TRAINSPEED_TEST_CRASH_AT=N and TRAINSPEED_TEST_CRASH_RANKS=0,1 make loss_fn raise on its N-th
call on those ranks: a user error inside the training step. TRAINSPEED_TEST_COUNT_RS=PATH writes
how many gradient reduce-scatters this rank issued to PATH.<rank>."""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

from trainspeed import Trainer


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 16), nn.Linear(16, 16)])
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x).squeeze(-1)


CALLS = 0


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    global CALLS
    CALLS += 1
    crash_at = int(os.environ.get("TRAINSPEED_TEST_CRASH_AT", 0))
    ranks = os.environ.get("TRAINSPEED_TEST_CRASH_RANKS", "0,1").split(",")
    if CALLS == crash_at and os.environ.get("RANK", "0") in ranks:
        raise RuntimeError(f"user loss_fn failed on call {CALLS}")
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def count_reduce_scatters(path: str) -> None:
    """Count FSDP2's gradient reduce-scatters (it calls dist.reduce_scatter_single in torch
    2.13); the count is written at exit."""
    import atexit

    import torch.distributed as dist

    original, calls = dist.reduce_scatter_single, [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    dist.reduce_scatter_single = counted
    atexit.register(lambda: open(f"{path}.{os.environ.get('RANK', '0')}", "w").write(str(calls[0])))


def main() -> None:
    if os.environ.get("TRAINSPEED_TEST_COUNT_RS"):
        count_reduce_scatters(os.environ["TRAINSPEED_TEST_COUNT_RS"])
    out_dir, name, *overrides = sys.argv[1:]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(-1).sin())
    config = {"run": {"out_dir": out_dir, "name": name, "device": "cpu", "max_steps": 8,
                      "torch_threads": 1},
              "distributed": {"strategy": "fsdp"}, "logging": {"every": 1, "progress": False},
              "data": {"batch_size": 4}, "checkpoint": {"every_steps": None}}
    for item in overrides:
        key, value = item.split("=", 1)
        section, field = key.split(".")
        config.setdefault(section, {})[field] = None if value == "null" else (
            int(value) if value.lstrip("-").isdigit() else value)
    torch.manual_seed(0)
    Trainer(Net(), loss_fn, data, config=config).fit()


if __name__ == "__main__":
    main()
