"""A well-tuned CPU loop: in-memory data indexed a batch at a time, compute-bound model,
loss read only at the log interval. The doctor must find nothing at warning level."""
import argparse

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Dataset


class InMemory(Dataset):
    """Indexing with a list of indices returns a whole batch: one gather instead of per-sample
    __getitem__ calls and a collate."""

    def __init__(self, n: int, dim: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, idx):
        return self.x[idx], self.y[idx]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--width", type=int, default=768)  # compute well above the ~0.1 ms batch gather, even on a loaded machine
    args = parser.parse_args()
    torch.manual_seed(0)
    data = InMemory(4096, 256)
    loader = DataLoader(data, sampler=BatchSampler(RandomSampler(data), batch_size=64, drop_last=True),
                        batch_size=None)
    model = nn.Sequential(nn.Linear(256, args.width), nn.GELU(), nn.Linear(args.width, args.width), nn.GELU(),
                          nn.Linear(args.width, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # 1.51x the default per-parameter loop on a CPU
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step % 100 == 0:
                print(f"step {step} loss {loss.item():.3f}")
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
