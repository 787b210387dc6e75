"""LightningCLI scripts take their settings as `--data.num_workers=2` (jsonargparse, which never
calls argparse's parse_known_args): the doctor recorded no flags for them, and advised
`DataLoader(..., num_workers=...)` for a DataModule whose command line sets it."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(180)

SCRIPT = '''import torch
import lightning as L
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self, hidden: int = 64, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class Data(L.LightningDataModule):
    def __init__(self, batch_size: int = 16, num_workers: int = 0):
        super().__init__()
        self.batch_size, self.num_workers = batch_size, num_workers

    def train_dataloader(self):
        ds = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
        return DataLoader(ds, batch_size=self.batch_size, num_workers=self.num_workers)


if __name__ == "__main__":
    LightningCLI(Model, Data)
'''


def test_lightning_cli_settings_are_the_scripts_flags(tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    pytest.importorskip("jsonargparse")
    from trainspeed.doctor.checks.script_flags import find_flag
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    monkeypatch.chdir(tmp_path)
    (tmp_path / "main.py").write_text(SCRIPT)
    command = ["python", "main.py", "fit", "--trainer.accelerator=cpu", "--trainer.max_epochs=3",
               "--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.log_every_n_steps=1",
               "--data.batch_size=32"]
    result = run_doctor(DoctorConfig(command=command, steps=12, out=tmp_path / "run", system_sampler=False))
    assert result.steps == 12, result.traceback
    flags = [json.loads(line)["data"] for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()
             if '"script_flags"' in line]
    assert flags and flags[0]["source"] == "jsonargparse"
    rows = flags[0]["flags"]
    values = {r["option"]: r["value"] for r in rows}
    # the fit subcommand's config, the command line's values applied
    assert values["--data.batch_size"] == 32 and values["--data.num_workers"] == 0
    assert values["--trainer.max_epochs"] == 3 and values["--model.lr"] == 0.001
    assert find_flag(rows, "num_workers")["option"] == "--data.num_workers"
    assert find_flag(rows, "log_interval") == {**find_flag(rows, "log_interval"),
                                               "option": "--trainer.log_every_n_steps", "value": 1}
