"""Regression from pytorch/examples' word_language_model (docs/real-scripts.md): the script saves
its whole model with `torch.save(model, f)` at the end of an epoch and loads it back with
`torch.load` under `torch.serialization.safe_globals` (weights_only). Its compile trial died in
that save: "Can't pickle local object '_traceable_forward.<locals>.forward'" (the instance
forward the compile and precision settings give the trained module)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.timeout(60)

WORD_LM = """
import torch
from torch import nn


class RNNModel(nn.Module):
    def __init__(self, ntoken=50, ninp=16, nhid=16):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.encoder(input), hidden)
        return self.decoder(output).view(-1, 50), hidden

    def init_hidden(self, bsz):
        return (torch.zeros(1, bsz, 16), torch.zeros(1, bsz, 16))


torch.manual_seed(0)
data = torch.randint(0, 50, (201, 4))
model = RNNModel()
criterion = nn.CrossEntropyLoss()
lr, best_val_loss = 0.5, None
for epoch in range(1, 3):
    model.train()
    hidden = model.init_hidden(4)
    for i in range(0, 200, 20):
        x, y = data[i:i + 20], data[i + 1:i + 21].reshape(-1)
        model.zero_grad()
        hidden = tuple(h.detach() for h in hidden)
        output, hidden = model(x, hidden)
        loss = criterion(output.float(), y)
        loss.backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
    val_loss = loss.item()
    if not best_val_loss or val_loss < best_val_loss:
        with open(SAVE, "wb") as f:
            torch.save(model, f)
        best_val_loss = val_loss
with open(SAVE, "rb") as f:
    with torch.serialization.safe_globals([RNNModel, nn.LSTM, nn.Linear, nn.Embedding]):
        model = torch.load(f)
model.eval()
with torch.no_grad():
    LOADED_OUT = model(data[:20], model.init_hidden(4))[0]
"""


def _cpu_runs_bf16_lstm() -> bool:
    """oneDNN has no bf16 LSTM on CPUs without AVX-512 BF16 ("could not create a primitive
    descriptor for the LSTM forward propagation primitive", seen on a CI machine): there the
    script itself fails under bf16 autocast, with or without trainspeed."""
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.LSTM(4, 4)(torch.zeros(2, 1, 4))
    except RuntimeError:
        return False
    return True


BF16 = pytest.param({"precision": "bf16"}, marks=pytest.mark.skipif(
    not _cpu_runs_bf16_lstm(), reason="this CPU's oneDNN has no bf16 LSTM (the compile case covers the save)"))


@pytest.mark.parametrize("settings", [BF16, {"compile": "default"}])
def test_a_patched_model_saved_whole_loads_with_the_scripts_allow_list(script, tmp_path, monkeypatch, settings):
    if "compile" in settings:  # the save is the point, not the compiling: fail it fast (runs eager)
        import torch._inductor.compile_fx as compile_fx

        monkeypatch.setattr(compile_fx, "compile_fx", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("off")))
    save = tmp_path / "model.pt"
    g, notes = script(WORD_LM).run(settings, SAVE=str(save))
    assert g["LOADED_OUT"].shape == (80, 50) and torch.isfinite(g["LOADED_OUT"]).all()
    assert not any("Can't pickle" in n for n in notes), notes
    # the file is the one the unpatched script writes: no trainspeed object in it, and the
    # live model kept its patched forward through the save (it was put back), until uninstall
    assert b"trainspeed" not in save.read_bytes()
    assert "forward" not in g["model"].__dict__


def test_state_dict_saves_pass_straight_through(script, tmp_path):
    source = """
import torch
from torch import nn
model = nn.Sequential(nn.Linear(4, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    loss = model(torch.randn(2, 4)).sum()
    opt.zero_grad(); loss.backward(); opt.step()
    FORWARD_DURING = "forward" in model.__dict__
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, SAVE)
"""
    g, _ = script(source).run({"precision": "bf16"}, SAVE=str(tmp_path / "ck.pt"))
    assert g["FORWARD_DURING"]  # the autocast forward stays on for the training
    assert set(torch.load(tmp_path / "ck.pt")) == {"model", "opt"}
