"""Planted GPU cause: a per-step loss.item() (--log-every 1) in a loop whose host work (Python
bookkeeping between the steps, ~8 ms) and GPU work (~11 ms on an H100) take about as long, and
both far longer than the kernel launches: each read waits for the GPU's queue to drain, then
the host's bookkeeping runs while the GPU idles, instead of while it computes. Without the read
a step takes about the longer of the two; with it, their sum.

The first version (width 4096, 60k bookkeeping iterations) had ~3 ms of GPU work, which the
launches under the doctor covered: the read waited for almost nothing, and reading every 10
steps measured 0.96x on an H100.

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
width, batch, host = (64, 16, 1000) if args.small else (8192, 4096, 150_000)
torch.manual_seed(0)
model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.GELU())], nn.Linear(width, 10)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
x = torch.randn(batch, width, device=device)
y = torch.randint(0, 10, (batch,), device=device)
total, books = 0.0, {}


def bookkeeping(step):
    """Host work between steps (a few ms of plain Python: counters, a schedule, bookkeeping)."""
    acc = 0
    for i in range(host):
        acc += (i * step) % 7
    books[step % 16] = acc


for step in range(args.steps):
    bookkeeping(step)
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step % args.log_every == 0:
        total += loss.item()  # a host sync: waits for the whole step's GPU work
print(f"mean logged loss {total / max(1, args.steps // args.log_every):.4f}")
