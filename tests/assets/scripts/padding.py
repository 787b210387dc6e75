"""Planted problem: every batch is padded to a fixed max length of 256 tokens (pad id 0) while
real sequences are 8-40 tokens long, so most of the compute is spent on padding."""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

MAX_LEN = 256
PAD = 0


class Sequences(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.seqs = [torch.randint(1, 100, (int(torch.randint(8, 41, (1,), generator=g)),), generator=g)
                     for _ in range(n)]

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i):
        seq = self.seqs[i]
        padded = torch.full((MAX_LEN,), PAD, dtype=torch.long)  # pad to the global max length
        padded[: len(seq)] = seq
        return padded, padded.roll(-1)


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 64)
        self.mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        self.head = nn.Linear(64, 100)

    def forward(self, ids):
        return self.head(self.mlp(self.emb(ids)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Sequences(512), batch_size=8, shuffle=True, drop_last=True)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    while step < args.steps:
        for ids, targets in loader:
            logits = model(ids)
            loss = nn.functional.cross_entropy(logits.reshape(-1, 100), targets.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
