"""Planted problem: heavy per-sample transforms in __getitem__ with num_workers=0, so the
training step waits for the DataLoader."""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Augmented(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(n, 3, 32, 32, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        img = self.images[i]
        # a per-sample augmentation pipeline written as many small ops (slow in Python)
        for _ in range(12):
            img = torch.roll(img, shifts=1, dims=2)
            img = (img - img.mean()) / (img.std() + 1e-5)
            img = torch.flip(img, dims=[2]) if bool(torch.rand(()) > 0.5) else img
        return img, self.labels[i]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Augmented(1024), batch_size=32, shuffle=True, num_workers=0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
