"""Planted problem: per-step TensorBoard logging of the mean over a history list that keeps
growing (every per-sample loss since the start), so each step costs more than the last."""
import argparse
import tempfile

import numpy as np
import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--logdir", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    writer = SummaryWriter(args.logdir or tempfile.mkdtemp(prefix="tb-"))
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(1024, 32), torch.randn(1024, 1)
    history: list[float] = []
    for step in range(1, args.steps + 1):
        per_sample = (model(x) - y).pow(2).squeeze(1)
        loss = per_sample.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.extend(per_sample.detach().numpy())  # grows by 1024 values every step
        writer.add_scalar("loss/running_mean", float(np.mean(history)), step)
    writer.close()


if __name__ == "__main__":
    main()
