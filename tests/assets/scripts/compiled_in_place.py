"""A model compiled in place (`model.compile()`, as word_language_model's and many scripts'
--compile flags do), batches built in the loop (no DataLoader), fused AdamW. `--backend eager`
keeps dynamo's hook handling without inductor's minutes of code generation."""
import argparse

import torch
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--batch", type=int, default=24)
ap.add_argument("--backend", default="inductor")
args = ap.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))
model.compile(backend=args.backend)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
for step in range(args.steps):
    x, y = torch.randn(args.batch, 64), torch.randint(0, 10, (args.batch,))
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step % 10 == 0:
        print(step, loss.item())
