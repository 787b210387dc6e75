"""A manual update without torch.optim (`p -= lr * p.grad` under no_grad, as in pytorch/examples
regression and word_language_model), that saves a checkpoint of the model after every step.
Planted: torch.save every step."""
import argparse
import os

import torch
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--ckpt-dir", default="ckpt")
    args = p.parse_args()
    os.makedirs(args.ckpt_dir, exist_ok=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))  # the model: 1.7 MB per checkpoint
    for step in range(args.steps):
        loss = nn.functional.cross_entropy(model(x), y)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for param in model.parameters():
                param -= 0.01 * param.grad
        torch.save(model.state_dict(), os.path.join(args.ckpt_dir, f"model-{step}.pt"))


if __name__ == "__main__":
    main()
