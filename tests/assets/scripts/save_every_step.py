"""Planted problem: torch.save of the model and optimizer every step."""
import argparse
import os
import tempfile

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ckpt-dir", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    ckpt_dir = args.ckpt_dir or tempfile.mkdtemp(prefix="ckpt-")
    os.makedirs(ckpt_dir, exist_ok=True)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
    for step in range(1, args.steps + 1):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                   os.path.join(ckpt_dir, f"step{step}.pt"))  # planted: a checkpoint per step


if __name__ == "__main__":
    main()
