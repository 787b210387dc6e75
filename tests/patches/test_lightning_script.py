"""Run-time settings reach a Lightning script's training loader and model (Lightning calls
`training_step` itself: the trained module is the one the step calls)."""

from __future__ import annotations

import runpy

import pytest
import torch

from trainspeed.patches import install_settings
from trainspeed.patches.targets import Targets

pytestmark = pytest.mark.timeout(180)

NET = '''
DTYPES = []


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        DTYPES.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"))
        return self.fc(x)
'''
"""The trained module of both scripts: records whether each forward ran under autocast."""

SCRIPT = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import lightning as L
''' + NET + '''

class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = Net()

    def training_step(self, batch, i):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        ds = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        return DataLoader(ds, batch_size=8, num_workers=0)

    def val_dataloader(self):
        ds = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        return DataLoader(ds, batch_size=32)

    def validation_step(self, batch, i):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)


module = Module()
trainer = L.Trainer(max_steps=6, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                    limit_val_batches=1, val_check_interval=3)
trainer.fit(module)
LOADERS = (trainer.train_dataloader.num_workers, trainer.val_dataloaders.num_workers)
'''


def test_lightning_training_loader_and_model_get_the_settings(tmp_path):
    pytest.importorskip("lightning")
    script = tmp_path / "train_lightning.py"
    script.write_text(SCRIPT)
    applied = install_settings({"loader.num_workers": 1, "precision": "bf16"},
                               Targets(loader_site=(str(script), 34), model_class="Net"), say=lambda s: None)
    try:
        g = runpy.run_path(str(script), run_name="__main__")
    finally:
        applied.uninstall()
    assert g["LOADERS"] == (1, 0), applied.notes  # the validation loader kept its own setting
    assert g["DTYPES"][1] == torch.bfloat16, g["DTYPES"]
    assert any("DataLoader at train_lightning.py:34" in n for n in applied.notes)


FABRIC_SCRIPT = '''
import torch
from torch import nn
import lightning as L

''' + NET + '''

fabric = L.Fabric(accelerator="cpu", devices=1)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = fabric.setup(model, optimizer)
for step in range(4):
    x, y = torch.randn(8, 8), torch.randint(0, 2, (8,))
    loss = nn.functional.cross_entropy(model(x), y)
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
'''


def test_a_fabric_module_gets_autocast_without_calling_itself(tmp_path):
    # Lightning's examples/fabric/language_model/train.py: the trained module is Fabric's
    # _FabricModule, whose __setattr__ also sets `forward` on the module it wraps; our autocast
    # forward then called the wrapper's, which called it back: RecursionError in every trial
    pytest.importorskip("lightning")
    script = tmp_path / "fabric_train.py"
    script.write_text(FABRIC_SCRIPT)
    applied = install_settings({"precision": "bf16"}, Targets(model_class="_FabricModule"), say=lambda s: None)
    try:
        g = runpy.run_path(str(script), run_name="__main__")
    finally:
        applied.uninstall()
    assert g["DTYPES"] == [torch.bfloat16] * 4, applied.notes
    assert any("_FabricModule.forward runs under torch.autocast" in n for n in applied.notes)
    assert "forward" not in g["model"].__dict__ and "forward" not in g["model"]._forward_module.__dict__
