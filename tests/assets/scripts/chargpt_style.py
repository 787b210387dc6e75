"""Written like karpathy/minGPT's projects/chargpt/chargpt.py (with mingpt/trainer.py inlined):
a config tree overridden by `--trainer.max_iters=200`-style arguments, a character dataset read
from a text file, a DataLoader with a RandomSampler drawing with replacement for ever, a loop
that ends at max_iters, and a batch-end callback that prints the loss every 10 iterations and,
every 500 (iteration 0 included), samples from the model under no_grad and saves it."""

import ast
import os
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset


class CN:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def merge_from_args(self, args):
        for arg in args:
            key, val = arg.split("=", 1)
            keys = key[2:].split(".")
            obj = self
            for k in keys[:-1]:
                obj = getattr(obj, k)
            try:
                val = ast.literal_eval(val)
            except ValueError:
                pass
            print(f"command line overwriting config attribute {key[2:]} with {val}")
            setattr(obj, keys[-1], val)


def get_config():
    return CN(system=CN(seed=3407, work_dir="./out/chargpt"),
              data=CN(block_size=32, input="input.txt"),
              model=CN(n_layer=1, n_embd=32, n_head=2),
              trainer=CN(device="auto", num_workers=4, max_iters=None, batch_size=16, learning_rate=5e-4,
                         grad_norm_clip=1.0))


class CharDataset(Dataset):
    def __init__(self, config, data):
        self.config = config
        chars = sorted(set(data))
        self.stoi = {ch: i for i, ch in enumerate(chars)}
        self.itos = {i: ch for i, ch in enumerate(chars)}
        self.vocab_size = len(chars)
        self.data = data

    def __len__(self):
        return len(self.data) - self.config.block_size

    def __getitem__(self, idx):
        chunk = self.data[idx:idx + self.config.block_size + 1]
        dix = [self.stoi[s] for s in chunk]
        return torch.tensor(dix[:-1], dtype=torch.long), torch.tensor(dix[1:], dtype=torch.long)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c.n_embd), nn.LayerNorm(c.n_embd)
        self.attn = nn.MultiheadAttention(c.n_embd, c.n_head, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(), nn.Linear(4 * c.n_embd, c.n_embd))

    def forward(self, x):
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.block_size = c.block_size
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.n_embd), nn.Embedding(c.block_size, c.n_embd)
        self.blocks = nn.Sequential(*[Block(c) for _ in range(c.n_layer)])
        self.head = nn.Linear(c.n_embd, c.vocab_size)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1))
        logits = self.head(self.blocks(self.wte(idx) + self.wpe(pos)))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, n):
        for _ in range(n):
            logits, _ = self(idx[:, -self.block_size:])
            probs = F.softmax(logits[:, -1, :], dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
        return idx


class Trainer:
    def __init__(self, config, model, train_dataset):
        self.config, self.model, self.train_dataset = config, model, train_dataset
        self.callbacks = {}
        self.device = "cuda" if config.device == "auto" and torch.cuda.is_available() else "cpu"
        self.model = self.model.to(self.device)
        self.iter_num, self.iter_time, self.iter_dt = 0, 0.0, 0.0

    def set_callback(self, onevent, callback):
        self.callbacks[onevent] = [callback]

    def run(self):
        model, config = self.model, self.config
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, betas=(0.9, 0.95))
        train_loader = DataLoader(
            self.train_dataset,
            sampler=torch.utils.data.RandomSampler(self.train_dataset, replacement=True, num_samples=int(1e10)),
            shuffle=False, pin_memory=True, batch_size=config.batch_size, num_workers=config.num_workers)
        model.train()
        self.iter_time = time.time()
        data_iter = iter(train_loader)
        while True:
            try:
                batch = next(data_iter)
            except StopIteration:
                data_iter = iter(train_loader)
                batch = next(data_iter)
            x, y = [t.to(self.device) for t in batch]
            logits, self.loss = model(x, y)
            model.zero_grad(set_to_none=True)
            self.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_norm_clip)
            self.optimizer.step()
            for callback in self.callbacks.get("on_batch_end", []):
                callback(self)
            self.iter_num += 1
            tnow = time.time()
            self.iter_dt, self.iter_time = tnow - self.iter_time, tnow
            if config.max_iters is not None and self.iter_num >= config.max_iters:
                break


if __name__ == "__main__":
    config = get_config()
    config.merge_from_args(sys.argv[1:])
    os.makedirs(config.system.work_dir, exist_ok=True)
    torch.manual_seed(config.system.seed)
    if not os.path.exists(config.data.input):  # the real script reads input.txt from the cwd
        with open(config.data.input, "w") as f:
            f.write("O God, O God! how weary, stale, flat and unprofitable seem to me all the uses of this world!\n" * 200)
    text = open(config.data.input).read()
    train_dataset = CharDataset(config.data, text)
    config.model.vocab_size, config.model.block_size = train_dataset.vocab_size, config.data.block_size
    model = GPT(config.model)
    trainer = Trainer(config.trainer, model, train_dataset)

    def batch_end_callback(trainer):
        if trainer.iter_num % 10 == 0:
            print(f"iter_dt {trainer.iter_dt * 1000:.2f}ms; iter {trainer.iter_num}: train loss {trainer.loss.item():.5f}")
        if trainer.iter_num % 500 == 0:
            model.eval()
            with torch.no_grad():
                x = torch.tensor([train_dataset.stoi[s] for s in "O God, O God!"], dtype=torch.long)[None, ...]
                y = model.generate(x, 20)[0]
                print("".join(train_dataset.itos[int(i)] for i in y))
            torch.save(model.state_dict(), os.path.join(config.system.work_dir, "model.pt"))
            model.train()

    trainer.set_callback("on_batch_end", batch_end_callback)
    trainer.run()
