"""Planted GPU cause: fp32 matmuls on a GPU with tensor cores (no autocast). A wide MLP on data
already on the device; nothing else in the loop. Unchanged under benchmarks/gpu_truth.py.

    python fp32_mlp.py --steps 200 [--small]
"""
import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--small", action="store_true", help="tiny sizes (a CPU dry run)")
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
width, batch = (64, 16) if args.small else (8192, 2048)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                      nn.Linear(width, 10)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
x = torch.randn(batch, width, device=device)
y = torch.randint(0, 10, (batch,), device=device)
for step in range(args.steps):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step % 100 == 0:
        print(f"step {step} loss {loss.item():.4f}")
