"""Planted problem: gc.collect() and torch.cuda.empty_cache() inside the training loop."""
import argparse
import gc

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
    for step in range(1, args.steps + 1):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        gc.collect()  # planted: "free memory" every step
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
