"""Planted GPU cause: a convolutional net with fixed input shapes and cuDNN's autotuner left
off (torch.backends.cudnn.benchmark is False by default). bf16 autocast, data on the device.

    python cudnn_off.py --steps 200 [--small]
"""
import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--small", action="store_true")
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
batch, side, ch = (4, 32, 8) if args.small else (64, 128, 128)
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, ch, 3, padding=1), nn.BatchNorm2d(ch), nn.ReLU(),
                      nn.Conv2d(ch, ch, 5, padding=2), nn.BatchNorm2d(ch), nn.ReLU(),
                      nn.Conv2d(ch, ch, 3, padding=1, groups=4), nn.BatchNorm2d(ch), nn.ReLU(),
                      nn.Conv2d(ch, ch, 5, padding=2), nn.BatchNorm2d(ch), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(ch, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(batch, 3, side, side, device=device)
y = torch.randint(0, 10, (batch,), device=device)
for step in range(args.steps):
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print(f"final loss {loss.item():.4f}")
