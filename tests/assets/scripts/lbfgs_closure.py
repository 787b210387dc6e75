"""LBFGS with a closure (several forward/backward evaluations of one batch per step, as in
pytorch/examples time_sequence_prediction), fed by a DataLoader whose __getitem__ builds each
sample in Python (num_workers=0). Planted: the per-sample data work."""
import argparse
import math

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Waves(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        # per-sample work in Python: a noisy sine wave, point by point
        phase = (i * 0.37) % 6.28
        xs = [math.sin(phase + k * 0.05) + 0.01 * ((i * 7919 + k * 104729) % 101 - 50) / 50 for k in range(400)]
        t = torch.tensor(xs, dtype=torch.float32)
        return t[:-1], t[1:]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(399, 256), nn.Tanh(), nn.Linear(256, 399))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    loader = DataLoader(Waves(), batch_size=32, shuffle=True, num_workers=0)
    step = 0
    while step < args.steps:
        for x, y in loader:
            def closure():
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss
            optimizer.step(closure)
            step += 1


if __name__ == "__main__":
    main()
