"""Planted GPU cause: a per-step loss.item() (--log-every 1) in a loop whose host work (building
the batch on the CPU) and GPU work take about as long: each read drains the GPU's queue, so the
next batch is built while the GPU idles instead of while it computes.

    python item_sync.py --steps 300 [--log-every 1] [--small]
"""
import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--log-every", type=int, default=1)
p.add_argument("--small", action="store_true")
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
width, batch, host = (64, 16, 64) if args.small else (4096, 4096, 1024)
torch.manual_seed(0)
model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.GELU())], nn.Linear(width, 10)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
mix = torch.randn(host, host)
base = torch.randn(batch, width, device=device)
y = torch.randint(0, 10, (batch,), device=device)
total = 0.0
for step in range(args.steps):
    # host work per step (a few ms on the CPU): new features for part of the batch, copied in
    feats = torch.tanh(torch.randn(min(256, batch), host) @ mix)[:, :width].contiguous()
    x = base.clone()
    x[: feats.shape[0]] = feats.to(device, non_blocking=True)
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step % args.log_every == 0:
        total += loss.item()  # a host sync: waits for the whole step's GPU work
print(f"mean logged loss {total / max(1, args.steps // args.log_every):.4f}")
