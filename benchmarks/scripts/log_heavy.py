"""A training script that logs and checkpoints on every step, as many loops start out:
TensorBoard scalars and weight histograms each step, a full checkpoint every
--save-every steps (default 1). Used unchanged by benchmarks/script_tune.py.

    python log_heavy.py --steps 200 --out DIR
"""

import argparse
import os
import tempfile

import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--log-every", type=int, default=1)
parser.add_argument("--save-every", type=int, default=1)
parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "trainspeed-bench-log-heavy"))
args = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
writer = SummaryWriter(os.path.join(args.out, "tb"))
data = torch.randn(4096, 256)
labels = torch.randint(0, 10, (4096,))
for step in range(args.steps):
    idx = torch.randint(0, len(data), (64,))
    loss = nn.functional.cross_entropy(model(data[idx]), labels[idx])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % args.log_every == 0:
        writer.add_scalar("loss", loss.item(), step)
        for name, p in model.named_parameters():
            writer.add_histogram(name, p.detach(), step)
    if step % args.save_every == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                   os.path.join(args.out, "last.pt"))
writer.close()
