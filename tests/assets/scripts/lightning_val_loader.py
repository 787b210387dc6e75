"""A PyTorch Lightning script with a validation loader 8x the training batch (256 vs 32), run
every few steps, and num_workers=0 on both: the doctor must quote the training loader."""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning as L
except ImportError:  # pragma: no cover - older installs
    import pytorch_lightning as L


class Slow(TensorDataset):
    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        for _ in range(30):  # per-sample work in the training process
            x = (x - x.mean()) / (x.std() + 1e-5)
        return x, y


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    train = DataLoader(Slow(torch.randn(2048, 64, generator=g), torch.randint(0, 10, (2048,), generator=g)),
                       batch_size=32, shuffle=True, num_workers=args.workers)
    val = DataLoader(TensorDataset(torch.randn(512, 64, generator=g), torch.randint(0, 10, (512,), generator=g)),
                     batch_size=256, num_workers=args.workers)
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False, val_check_interval=20,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Classifier(), train, val)


if __name__ == "__main__":
    main()
