"""A Lightning script in the shape of Lightning's own examples/pytorch/basics/transformer.py:
the training loss logged with prog_bar=True (read back to the host every step for the
progress bar), a validation step that logs with prog_bar=True too."""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning as L
except ImportError:  # pragma: no cover - older installs
    import pytorch_lightning as L


class LanguageModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.log("train_loss", loss, prog_bar=True)  # TRAIN LOG
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.model(x), y), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(2048, 32), torch.randint(0, 8, (2048,)))
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_model_summary=False, gradient_clip_val=0.25)
    trainer.fit(LanguageModel(), DataLoader(data, batch_size=16, shuffle=True), DataLoader(data, batch_size=64))


if __name__ == "__main__":
    main()
