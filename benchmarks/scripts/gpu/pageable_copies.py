"""Planted GPU cause: large host-to-device copies from pageable memory. Batches of images built
once on the host, served by a DataLoader with pin_memory=False, copied with .to(device) (no
non_blocking); the model is small, so the copies set the pace.

    python pageable_copies.py --steps 200 [--small]
"""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--small", action="store_true")
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
batch, side = (4, 32) if args.small else (128, 224)


class Batches(Dataset):
    """Whole batches made once (no per-step collation): a copy is all a step asks of the host."""

    def __init__(self, n=8):
        self.x = [torch.randn(batch, 3, side, side) for _ in range(n)]
        self.y = [torch.randint(0, 10, (batch,)) for _ in range(n)]

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return self.x[i % len(self.x)], self.y[i % len(self.y)]


loader = DataLoader(Batches(), batch_size=None, shuffle=False, pin_memory=False)
model = nn.Sequential(nn.Conv2d(3, 8, 7, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(8, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
torch.backends.cudnn.benchmark = True
step = 0
for x, y in loader:
    x, y = x.to(device), y.to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    step += 1
    if step >= args.steps:
        break
print(f"final loss {loss.item():.4f}")
