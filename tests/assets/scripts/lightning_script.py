"""A PyTorch Lightning script with a planted problem: heavy per-sample transforms and
num_workers=0, so training is data-bound."""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

try:
    import lightning as L
except ImportError:  # pragma: no cover - older installs
    import pytorch_lightning as L


class Augmented(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(n, 3, 32, 32, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        img = self.images[i]
        for _ in range(12):  # a per-sample augmentation pipeline of many small ops
            img = torch.roll(img, shifts=1, dims=2)
            img = (img - img.mean()) / (img.std() + 1e-5)
        return img, self.labels[i]


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 64), nn.ReLU(), nn.Linear(64, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Augmented(1024), batch_size=32, shuffle=True, num_workers=0)
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Classifier(), loader)


if __name__ == "__main__":
    main()
