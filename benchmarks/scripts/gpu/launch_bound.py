"""Planted GPU cause: launch-bound small steps. A deep stack of small layers on a batch of 8:
each kernel takes a few microseconds, fewer than the host needs to launch it.

    python launch_bound.py --steps 300 [--small]
"""
import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--small", action="store_true")
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
depth = 4 if args.small else 24
torch.manual_seed(0)
layers = []
for _ in range(depth):
    layers += [nn.Linear(256, 256), nn.LayerNorm(256), nn.GELU()]
model = nn.Sequential(*layers, nn.Linear(256, 10)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
x = torch.randn(8, 256, device=device)
y = torch.randint(0, 10, (8,), device=device)
for step in range(args.steps):
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print(f"final loss {loss.item():.4f}")
