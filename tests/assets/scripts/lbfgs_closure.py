"""LBFGS with a closure (up to 3 forward/backward evaluations of one batch per step, as in
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
        for _ in range(4):  # the augmentation's passes over the sample, in Python
            xs = [v + 0.001 * math.sin(v * 3.1) for v in xs]
        # targets with noise of their own: the loss keeps a floor (a fit that converges to ~0
        # slows LBFGS down 100x on denormal numbers)
        ys = [xs[k + 1] + 0.3 * math.cos(i * 12.9898 + k * 78.233) for k in range(399)]
        return torch.tensor(xs[:-1], dtype=torch.float32), torch.tensor(ys, dtype=torch.float32)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    torch.manual_seed(0)
    # small enough that LBFGS's own two-loop recursion (history_size vectors of every
    # parameter) stays below the data work: 399 -> 256 -> 399 with history 100 took 700 ms a step
    model = nn.Sequential(nn.Linear(399, 32), nn.Tanh(), nn.Linear(32, 399))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=2, history_size=10)
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
