"""A Hugging Face no_trainer-style classifier with its `--pad_to_max_length` switch (as in
transformers' run_glue_no_trainer.py): on, every sample is padded to --max_length and the
default collator stacks them; off, a collator pads each batch to its own longest sample.
Lengths are spread 8-120 tokens, so per-batch padding removes little and most of the padding is
the spread inside a batch."""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

PAD = 0


class Sentences(Dataset):
    def __init__(self, n: int, max_length: int, pad_to_max_length: bool) -> None:
        g = torch.Generator().manual_seed(0)
        self.items = []
        for _ in range(n):
            ids = torch.randint(1, 500, (int(torch.randint(8, 121, (1,), generator=g)),), generator=g)[:max_length]
            width = max_length if pad_to_max_length else len(ids)
            row = torch.full((width,), PAD, dtype=torch.long)
            row[: len(ids)] = ids
            self.items.append({"input_ids": row, "attention_mask": (row != PAD).long(), "labels": int(ids[0]) % 2})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def default_collator(items):
    return {k: torch.stack([it[k] for it in items]) if k != "labels" else torch.tensor([it[k] for it in items])
            for k in items[0]}


def collator_with_padding(items):
    longest = max(len(it["input_ids"]) for it in items)
    out = {"input_ids": torch.full((len(items), longest), PAD, dtype=torch.long),
           "attention_mask": torch.zeros((len(items), longest), dtype=torch.long),
           "labels": torch.tensor([it["labels"] for it in items])}
    for i, it in enumerate(items):
        out["input_ids"][i, : len(it["input_ids"])] = it["input_ids"]
        out["attention_mask"][i, : len(it["input_ids"])] = it["attention_mask"]
    return out


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(500, 64)
        self.mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        self.head = nn.Linear(64, 2)

    def forward(self, input_ids, attention_mask, labels):
        h = self.mlp(self.emb(input_ids)) * attention_mask.unsqueeze(-1)
        logits = self.head(h.sum(1) / attention_mask.sum(1, keepdim=True))
        return nn.functional.cross_entropy(logits, labels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--pad_to_max_length", action="store_true",
                        help="If passed, pad all samples to `max_length`. Otherwise, dynamic padding is used.")
    parser.add_argument("--per_device_train_batch_size", type=int, default=16)
    parser.add_argument("--max_train_steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = Sentences(512, args.max_length, args.pad_to_max_length)
    loader = DataLoader(data, batch_size=args.per_device_train_batch_size, shuffle=True, drop_last=True,
                        collate_fn=default_collator if args.pad_to_max_length else collator_with_padding)
    model = Classifier()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    while step < args.max_train_steps:
        for batch in loader:
            loss = model(**batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            step += 1
            if step >= args.max_train_steps:
                break


if __name__ == "__main__":
    main()
