"""A data-bound training script, written the way it is often first written: every sample is
read from disk and decoded + augmented in the main process (num_workers=0), so the step
waits on the data. Each file read also waits --latency-ms (default 0.5 ms), the latency of a
network disk or a bucket mount, where training data usually lives. No trainspeed inside: `make
demo` (trainspeed/demo.py) copies it into its run folder and diagnoses, tunes and patches it
as a user's own train.py; benchmarks/script_tune.py tunes it as `data_bound`.

    python slow_images.py --epochs 1 [--data DIR]
"""

import argparse
import os
import tempfile
import time

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "trainspeed-bench-images"))
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--latency-ms", type=float, default=0.5)
args = parser.parse_args()


def make_images(root: str, n: int = 1024) -> None:
    """PNG files on first use (so decoding costs real CPU, as with a real image folder)."""
    if os.path.isdir(root) and len(os.listdir(root)) >= n:
        return
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        pixels = (rng.random((96, 96, 3)) * 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(root, f"{i:05d}-{i % 10}.png"))


class ImageFolder(Dataset):
    def __init__(self, root: str):
        self.files = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".png"))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        path = self.files[i]
        time.sleep(args.latency_ms / 1e3)  # storage latency (see the module docstring)
        img = Image.open(path).convert("RGB").resize((64, 64), Image.BILINEAR)
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
        if torch.rand(()) < 0.5:  # augmentation: a flip and a little noise
            x = x.flip(2)
        x = x + 0.01 * torch.randn_like(x)
        return x, int(path[-5])


make_images(args.data)
torch.manual_seed(0)
loader = DataLoader(ImageFolder(args.data), batch_size=args.batch_size, shuffle=True, num_workers=0)
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
    nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
criterion = nn.CrossEntropyLoss()
for epoch in range(args.epochs):
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
