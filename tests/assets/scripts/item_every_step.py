"""Planted problem: `.item()` on the loss every step (a host sync per step on a GPU)."""
import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, fused=True)  # one planted cause: not the optimizer's loop
    x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
    running = 0.0
    for step in range(1, args.steps + 1):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        running += loss.item()  # planted: reads the loss back every step
    print(f"mean loss {running / args.steps:.3f}")


if __name__ == "__main__":
    main()
