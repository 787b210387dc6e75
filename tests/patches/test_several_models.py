"""Mixed precision on a loop that trains several models, as pytorch/examples' dcgan does: the
generator's output is the discriminator's input, and the losses (BCELoss on a Sigmoid, an fp32
label) are computed outside either forward. Autocast on one model only crashed the trial
("Input type (CPUBFloat16Type) and weight type (torch.FloatTensor) should be the same"); a
bf16 output reaching BCELoss, "Found dtype Float but expected BFloat16"."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from trainspeed.patches.code_change import code_change
from trainspeed.patches.targets import Targets

pytestmark = pytest.mark.timeout(120)

GAN = """
import torch
from torch import nn

INSIDE = {"Generator": [], "Discriminator": []}


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 12), nn.Tanh())

    def forward(self, z):
        INSIDE["Generator"].append(torch.is_autocast_enabled("cpu"))
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(12, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1), nn.Sigmoid())

    def forward(self, x):
        INSIDE["Discriminator"].append(torch.is_autocast_enabled("cpu"))
        return self.main(x).view(-1)


torch.manual_seed(0)
netG = Generator().to("cpu")
netD = Discriminator().to("cpu")
criterion = nn.BCELoss()
# setup optimizer
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4)
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4)
LOSS_DTYPES = set()
for i in range(4):
    real = torch.randn(6, 12)
    netD.zero_grad()
    label = torch.full((6,), 1.0)
    errD_real = criterion(netD(real), label)  # DCALL
    errD_real.backward()
    fake = netG(torch.randn(6, 8))  # GCALL
    label.fill_(0.0)
    errD_fake = criterion(netD(fake.detach()), label)
    errD_fake.backward()
    optimizerD.step()
    netG.zero_grad()
    label.fill_(1.0)
    errG = criterion(netD(fake), label)
    errG.backward()
    optimizerG.step()
    LOSS_DTYPES |= {errD_real.dtype, errD_fake.dtype, errG.dtype}
print("trained", sorted(str(d) for d in LOSS_DTYPES))
"""


@pytest.mark.parametrize("classes", [("Generator", "Discriminator"), ()], ids=["doctor-saw-both", "no-facts"])
def test_bf16_covers_every_trained_model_and_hands_back_fp32(script, classes):
    s = script(GAN)
    g, notes = s.run({"precision": "bf16"}, Targets(model_class=classes[0] if classes else None,
                                                      trained_classes=classes))
    assert g["INSIDE"]["Generator"] == [True] * 4
    assert g["INSIDE"]["Discriminator"] == [True] * 12  # three calls a step, the first one included
    assert g["LOSS_DTYPES"] == {torch.float32}  # the losses outside read fp32 outputs
    assert sorted(n for n in notes if n.startswith("precision")) == [
        "precision: Discriminator.forward runs under torch.autocast('cpu', torch.bfloat16)",
        "precision: Generator.forward runs under torch.autocast('cpu', torch.bfloat16)"]
    assert "forward" not in g["netD"].__dict__ and "forward" not in g["netG"].__dict__  # uninstalled


@pytest.mark.parametrize("classes", [("Generator", "Discriminator"), ("Generator",)], ids=["both", "one"])
def test_compile_acts_on_the_models_the_code_change_names(script, monkeypatch, classes):
    """compile and channels_last act on each model the doctor saw trained, as best.patch writes
    them: dcgan's trials compiled its discriminator only (the first trained module called), and
    best.patch named one model, so half of what a compile of the loop does went unmeasured."""
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn.__self__) or fn)
    g, notes = script(GAN).run({"compile": "default"}, Targets(model_class="Generator", trained_classes=classes))
    expected = [g["netD"], g["netG"]] if len(classes) == 2 else [g["netG"]]  # netD is called first
    assert compiled == expected, notes


def test_channels_last_converts_each_trained_model_and_its_inputs(script):
    s = script(GAN)
    g, notes = s.run({"channels_last": True}, Targets(model_class="Generator",
                                                      trained_classes=("Generator", "Discriminator")))
    assert sorted(n for n in notes if n.startswith("channels_last")) == [
        "channels_last: Discriminator and its 4-D inputs use torch.channels_last",
        "channels_last: Generator and its 4-D inputs use torch.channels_last"], notes
    assert g["netD"]._forward_pre_hooks == {} and g["netG"]._forward_pre_hooks == {}  # uninstalled


def _patched_and_run(s, settings: dict, tmp_path, expect: str) -> str:
    root = s.path.parent
    targets = Targets(script=str(s.path), model_class="Generator", model_call_site=s.site("# GCALL"),
                      optimizer_site=s.site("optimizerD = "), optimizer_class="Adam",
                      optimizer_sites=(s.site("optimizerD = "), s.site("optimizerG = ")),
                      trained_classes=("Generator", "Discriminator"))
    change = code_change(settings, targets, root=root, command=["python", "train.py"])
    change.write(tmp_path / "out")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "apply", str(tmp_path / "out" / "best.patch")], cwd=root, check=True)
    ran = subprocess.run([sys.executable, "-c", f"import runpy; g = runpy.run_path('train.py'); print({expect})"],
                         cwd=root, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    return change.patch, ran.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="git apply checks the patch")
def test_the_code_change_compiles_every_trained_model_before_the_optimizers(script, tmp_path):
    s = script(GAN)
    patch, out = _patched_and_run(s, {"compile": "default"}, tmp_path,
                                  "[type(m).__name__ for m in (g['netG'], g['netD']) if m._compiled_call_impl]")
    assert "+netG.compile()  # Generator\n" in patch and "+netD.compile()  # Discriminator\n" in patch
    assert patch.index("netD.compile()") < patch.index(" optimizerD = ")
    assert "['Generator', 'Discriminator']" in out


@pytest.mark.skipif(shutil.which("git") is None, reason="git apply checks the patch")
def test_the_code_change_puts_every_trained_model_and_its_inputs_in_channels_last(script, tmp_path):
    s = script(GAN)
    patch, out = _patched_and_run(s, {"channels_last": True}, tmp_path,
                                  "[len(m._forward_pre_hooks) for m in (g['netG'], g['netD'])]")
    assert "+netG = netG.to(memory_format=torch.channels_last)  # Generator\n" in patch
    assert "+netD.register_forward_pre_hook(channels_last_inputs)\n" in patch
    assert "[1, 1]" in out


def test_fused_goes_to_every_optimizer_the_doctor_saw_step(script):
    """dcgan's fused trial built optimizerD fused and optimizerG as written (the primary's site
    alone), and best.patch changed one line: half the optimizer time went unmeasured."""
    s = script(GAN)
    sites = (s.site("optimizerD = "), s.site("optimizerG = "))
    g, notes = s.run({"optimizer.impl": "fused"}, Targets(optimizer_site=sites[0], optimizer_class="Adam",
                                                          optimizer_sites=sites))
    assert g["optimizerD"].defaults["fused"] is True and g["optimizerG"].defaults["fused"] is True, notes
    g, _ = s.run({"optimizer.impl": "fused"}, Targets(optimizer_site=sites[0], optimizer_class="Adam"))
    assert g["optimizerD"].defaults["fused"] is True and not g["optimizerG"].defaults["fused"]  # one recorded


@pytest.mark.skipif(shutil.which("git") is None, reason="git apply checks the patch")
def test_the_code_change_makes_every_optimizer_fused(script, tmp_path):
    patch, out = _patched_and_run(script(GAN), {"optimizer.impl": "fused"}, tmp_path,
                                  "[g[n].defaults['fused'] for n in ('optimizerD', 'optimizerG')]")
    added = [line for line in patch.splitlines() if line.startswith("+optimizer")]
    assert added == ["+optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, fused=True)",
                     "+optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, fused=True)"], patch
    assert "[True, True]" in out


@pytest.mark.skipif(shutil.which("git") is None, reason="git apply checks the patch")
def test_the_code_change_wraps_every_model_and_the_patched_script_runs(script, tmp_path):
    s = script(GAN)
    root = s.path.parent
    targets = Targets(script=str(s.path), model_class="Generator", model_call_site=s.site("# GCALL"),
                      optimizer_site=s.site("optimizerD = "), trained_classes=("Generator", "Discriminator"))
    change = code_change({"precision": "bf16"}, targets, root=root, command=["python", "train.py"])
    assert "+netG.forward = autocast_forward(netG.forward)  # Generator\n" in change.patch
    assert "+netD.forward = autocast_forward(netD.forward)  # Discriminator\n" in change.patch
    assert change.patch.index("autocast_forward(netD") < change.patch.index(" optimizerD = ")
    change.write(tmp_path / "out")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "apply", str(tmp_path / "out" / "best.patch")], cwd=root, check=True)
    ran = subprocess.run([sys.executable, "-c", "import runpy; g = runpy.run_path('train.py'); "
                          "print(g['INSIDE'])"], cwd=root, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert "trained ['torch.float32']" in ran.stdout
    # the forwards run under autocast: every call of both models
    assert "{'Generator': [True, True, True, True], 'Discriminator': [True" in ran.stdout
    assert "False" not in ran.stdout.splitlines()[-1]


def test_one_trained_model_keeps_the_block_around_its_forward_and_loss(script):
    s = script(GAN)
    targets = Targets(script=str(s.path), model_class="Discriminator", model_call_site=s.site("# DCALL"),
                      trained_classes=("Discriminator",))
    snippet = code_change({"precision": "bf16"}, targets, root=s.path.parent, command=[]).snippets[0]
    assert snippet.where == "around" and "errD_real = criterion(netD(real), label)" in snippet.code


PERCEPTUAL = """
import collections
import torch
from torch import nn

INSIDE = {"Net": [], "Features": [], "Teacher": []}
Out = collections.namedtuple("Out", ["low", "high"])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        INSIDE["Net"].append(torch.is_autocast_enabled("cpu"))
        return self.lin(x)


class Features(nn.Module):  # a perceptual loss's network: frozen, the gradients flow through it
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.requires_grad_(False)

    def forward(self, x):
        INSIDE["Features"].append(torch.is_autocast_enabled("cpu"))
        low = self.a(x)
        return Out(low, self.b(low))


class Teacher(Net):
    def forward(self, x):
        INSIDE["Teacher"].append(torch.is_autocast_enabled("cpu"))
        return self.lin(x)


net, features, teacher = Net(), Features(), Teacher().requires_grad_(False)
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
DTYPES = set()
for step in range(3):
    x = torch.randn(4, 8)
    with torch.no_grad():
        hint = teacher(x)
    fy, fx = features(net(x)), features(x)
    DTYPES |= {fy.low.dtype, fy.high.dtype, type(fy).__name__}
    loss = sum(nn.functional.mse_loss(a, b) for a, b in zip(fy, fx)) + nn.functional.mse_loss(net(x), hint)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_bf16_covers_the_frozen_loss_network_the_gradients_flow_through(script):
    """fast_neural_style's VGG: autocast around the forward and the loss covers it. A teacher
    under no_grad is no loss network and keeps fp32."""
    g, notes = script(PERCEPTUAL).run({"precision": "bf16"}, Targets(model_class="Net", trained_classes=("Net",)))
    assert g["INSIDE"]["Net"] == [True] * 6
    assert g["INSIDE"]["Features"] == [True] * 6
    assert g["INSIDE"]["Teacher"] == [False] * 3
    assert g["DTYPES"] == {torch.float32, "Out"}  # the namedtuple's fields back in fp32, as a namedtuple
    assert any(n.startswith("precision: Features.forward runs under") for n in notes), notes
