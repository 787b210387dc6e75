"""Planted problem: a full validation pass after every training step."""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    val = DataLoader(TensorDataset(torch.randn(512, 64), torch.randint(0, 10, (512,))), batch_size=128)
    x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
    for step in range(1, args.steps + 1):
        model.train()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.eval()  # planted: evaluate after every step
        with torch.no_grad():
            correct = torch.zeros(())
            for vx, vy in val:
                correct += (model(vx).argmax(1) == vy).sum()


if __name__ == "__main__":
    main()
