"""What an optimizer updates, by name. Lightning's GAN example calls its LightningModule (the
root), which holds a generator and a discriminator, each with its own Adam: both read "Adam over
GAN" where the README promises `optimizerD (Adam over Discriminator)`."""

from __future__ import annotations

import pytest
from torch import nn

from doctor_helpers import observations, run_inline

pytestmark = pytest.mark.timeout(120)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8))


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.generator, self.discriminator = Generator(), nn.Linear(8, 1)


def _ids(params):
    return {id(p) for p in params}


def test_an_optimizer_over_one_submodule_names_that_submodule():
    from trainspeed.doctor.instrument.updates import updated_part

    gan = GAN()
    assert updated_part(gan, _ids(gan.generator.parameters())) is gan.generator  # not its one child
    assert updated_part(gan, _ids(gan.discriminator.parameters())) is gan.discriminator
    assert updated_part(gan, _ids(gan.parameters())) is gan  # all of it: the model itself
    # part of the generator (its matrices): the generator, not `net`, which holds what it holds
    matrices = [p for p in gan.generator.parameters() if p.dim() == 2]
    assert updated_part(gan, _ids(matrices)) is gan.generator
    # a wrapper updated entirely keeps the name the script called it by; partly, its part's
    wrapped = nn.Sequential(gan)
    assert updated_part(wrapped, _ids(wrapped.parameters())) is wrapped
    assert updated_part(wrapped, _ids(gan.discriminator.parameters())) is gan.discriminator


def test_a_doctor_run_names_each_optimizers_own_submodule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_inline(tmp_path, """
import torch
from torch import nn

class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 8)
    def forward(self, z):
        return self.net(z)

class GAN(nn.Module):  # a LightningModule's shape: the loop calls the root for the generator
    def __init__(self):
        super().__init__()
        self.generator, self.discriminator = Generator(), nn.Linear(8, 1)
    def forward(self, z):
        return self.generator(z)

gan = GAN()
opt_g = torch.optim.Adam(gan.generator.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(gan.discriminator.parameters(), lr=1e-3)
for step in range(30):
    opt_g.zero_grad()
    (-gan.discriminator(gan(torch.randn(16, 4))).mean()).backward()
    opt_g.step()
    opt_d.zero_grad()
    (gan.discriminator(gan(torch.randn(16, 4)).detach()).mean() - gan.discriminator(torch.randn(16, 8)).mean()).backward()
    opt_d.step()
""", steps=20)
    opts = {o["name"]: o for o in observations(result, "optimizer")}
    assert opts["opt_g"]["updates"] == ["Generator"]
    assert opts["opt_d"]["updates"] == ["Linear"]  # the discriminator: itself, and its part of GAN
