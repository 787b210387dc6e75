"""A compute-bound training script: data already in memory, wide matmuls, nothing else in
the loop. The honest answer for it is that no switch wins on a CPU without bf16 units.
Used unchanged by benchmarks/script_tune.py.

    python compute_bound.py --steps 200
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
args = parser.parse_args()

torch.manual_seed(0)
data = TensorDataset(torch.randn(8192, 512), torch.randint(0, 10, (8192,)))
loader = DataLoader(data, batch_size=256, shuffle=True)
model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
step = 0
while step < args.steps:
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step >= args.steps:
            break
print(f"final loss {loss.item():.4f}")
