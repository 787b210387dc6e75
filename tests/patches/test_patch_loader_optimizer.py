"""loader.* settings reach the training DataLoader only; optimizer.impl reaches the primary
optimizer's constructor."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from trainspeed.patches.targets import Targets

pytestmark = pytest.mark.timeout(120)

LOOP = """
import torch
from torch.utils.data import DataLoader, TensorDataset

ds = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
train = DataLoader(ds, batch_size=8, shuffle=True)  # TRAIN
val = DataLoader(ds, batch_size=16, num_workers=0, persistent_workers=False)  # VAL
model = torch.nn.Linear(4, 1)
opt = torch.optim.AdamW(model.parameters(), lr=0.01)  # OPT
other = torch.optim.SGD(model.parameters(), lr=0.01)  # OTHER
steps = 0
for x, y in train:
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    steps += 1
"""


def test_training_loader_gets_the_settings_and_validation_keeps_its_own(script):
    s = script(LOOP)
    targets = Targets(loader_site=s.site("# TRAIN"))
    g, notes = s.run({"loader.num_workers": 2, "loader.pin_memory": True, "loader.persistent_workers": True,
                      "loader.prefetch_factor": 3}, targets)
    train, val = g["train"], g["val"]
    assert (train.num_workers, train.pin_memory, train.persistent_workers, train.prefetch_factor) == (2, True, True, 3)
    assert (val.num_workers, val.pin_memory, val.persistent_workers) == (0, False, False)
    assert g["steps"] == 4  # the workers really loaded the epoch
    assert any(f"train.py:{targets.loader_site[1]}" in n and "num_workers=2" in n for n in notes), notes


def test_persistent_workers_without_workers_is_skipped_not_raised(script):
    s = script(LOOP.replace("shuffle=True)", "shuffle=True, num_workers=2, persistent_workers=True)"))
    g, notes = s.run({"loader.num_workers": 0, "loader.prefetch_factor": 4},
                     Targets(loader_site=s.site("# TRAIN")))
    assert g["train"].num_workers == 0 and g["train"].persistent_workers is False
    assert any("skipped" in n and "num_workers" in n for n in notes), notes


def test_without_a_site_every_loader_in_user_files_gets_them_and_a_note_says_so(script):
    s = script(LOOP)
    g, notes = s.run({"loader.pin_memory": True})
    assert g["train"].pin_memory and g["val"].pin_memory
    assert any("no training DataLoader site" in n for n in notes)
    # a loader built by the test itself after uninstall is untouched
    assert DataLoader(g["ds"]).pin_memory is False


def test_fused_reaches_the_primary_optimizer_only(script):
    s = script(LOOP)
    g, notes = s.run({"optimizer.impl": "fused"}, Targets(optimizer_site=s.site("# OPT")))
    assert g["opt"].defaults["fused"] is True
    assert not g["other"].defaults.get("fused")
    assert any("AdamW" in n and "fused=True" in n for n in notes), notes


def test_foreach_without_a_site_applies_to_user_optimizers(script):
    s = script(LOOP)
    g, _ = s.run({"optimizer.impl": "foreach"})
    assert g["opt"].defaults["foreach"] is True and g["other"].defaults["foreach"] is True


def test_fused_refused_falls_back_to_the_script_construction(script):
    # fused needs floating-point params on a supported device: float64 on CPU is refused
    s = script(LOOP.replace("torch.nn.Linear(4, 1)", "torch.nn.Linear(4, 1).to(torch.complex64)")
               .replace("for x, y in train:", "for x, y in []:"))
    g, notes = s.run({"optimizer.impl": "fused"}, Targets(optimizer_site=s.site("# OPT")))
    assert not g["opt"].defaults.get("fused")
    assert any(n.startswith("failed:") and "AdamW" in n for n in notes), notes


def test_optimizer_without_the_keyword_is_left_alone_with_a_note(script):
    s = script(LOOP.replace("torch.optim.AdamW(model.parameters(), lr=0.01)",
                            "torch.optim.LBFGS(model.parameters(), lr=0.01)").replace("for x, y in train:",
                                                                                     "for x, y in []:"))
    g, notes = s.run({"optimizer.impl": "fused"}, Targets(optimizer_site=s.site("# OPT")))
    assert isinstance(g["opt"], torch.optim.LBFGS)
    assert any("LBFGS" in n and "fused" in n for n in notes), notes
