"""Planted GPU cause: a data-bound loader. Per-sample numpy work in __getitem__ and
num_workers=0 (--workers), a bf16 model that needs far less time than the batch takes to build.

    python data_bound.py --steps 200 [--workers 0] [--small]
"""
import argparse

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--small", action="store_true")
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
dim = 64 if args.small else 1024


class Noisy(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        x = rng.standard_normal((dim, 16)).astype(np.float32)
        for _ in range(3):  # per-sample augmentation: a few passes of numpy work
            x = np.tanh(x @ rng.standard_normal((16, 16)).astype(np.float32))
        return torch.from_numpy(x.mean(axis=1)), int(i % 10)


loader = DataLoader(Noisy(), batch_size=64, shuffle=True, num_workers=args.workers,
                    persistent_workers=args.workers > 0)
model = nn.Sequential(nn.Linear(dim, 1024), nn.GELU(), nn.Linear(1024, 10)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
step = 0
while step < args.steps:
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step >= args.steps:
            break
print(f"final loss {loss.item():.4f}")
