"""nanoGPT's train.py in miniature: `--key=value` overrides read from sys.argv (its
configurator, no argparse), batches built in the main process by get_batch (np.memmap slices,
torch.from_numpy, torch.stack, random offsets from torch.randint: no DataLoader), gradient
accumulation that divides the micro-batch loss before backward, estimate_loss() under
@torch.no_grad() every eval_interval steps with .item() inside, and the printed loss
`loss.item() * gradient_accumulation_steps` (also appended to printed_losses.txt)."""
import ast
import os
import sys

import numpy as np
import torch
from torch import nn

batch_size = 8
block_size = 64
gradient_accumulation_steps = 1
eval_interval = 10
eval_iters = 4
log_interval = 1
max_iters = 100000
learning_rate = 1e-3
compile = False
for arg in sys.argv[1:]:  # nanoGPT's configurator.py, reduced
    key, val = arg[2:].split("=", 1)
    globals()[key] = ast.literal_eval(val)

vocab = 65
if not os.path.exists("train.bin"):
    rng = np.random.default_rng(0)
    rng.integers(0, vocab, 200_000, dtype=np.uint16).tofile("train.bin")
    rng.integers(0, vocab, 20_000, dtype=np.uint16).tofile("val.bin")


def get_batch(split):
    data = np.memmap(f"{split}.bin", dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64)) for i in ix])
    return x.to("cpu"), y.to("cpu")


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab, 64)
        self.wpe = nn.Embedding(block_size, 64)
        self.mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
        self.head = nn.Linear(64, vocab)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(pos)
        logits = self.head(x + self.mlp(x))
        loss = None if targets is None else nn.functional.cross_entropy(logits.view(-1, vocab), targets.view(-1))
        return logits, loss


torch.manual_seed(1337)
model = TinyGPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
scaler = torch.amp.GradScaler("cpu", enabled=False)
if compile:
    model = torch.compile(model)


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


X, Y = get_batch("train")
iter_num = 0
while True:
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    for micro_step in range(gradient_accumulation_steps):
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")  # the next micro-batch, while the device works
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if iter_num % log_interval == 0:
        lossf = loss.item() * gradient_accumulation_steps
        print(f"iter {iter_num}: loss {lossf:.4f}")
        with open("printed_losses.txt", "a") as f:
            f.write(f"{lossf}\n")
    iter_num += 1
    if iter_num > max_iters:
        break
