"""Each optimizer's own loss. dcgan (two optimizers, D's two backwards then G's one) had one loss
column: the mean of the last iteration's errG and this one's errD_real and errD_fake, a curve
neither network follows. Now each optimizer's loss is recorded under the script's name for it,
equal to what the script itself computes, and the report reads them apart."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from doctor_helpers import run_inline

pytestmark = pytest.mark.timeout(120)

# The script writes the losses it computes (errD = errD_real + errD_fake, as dcgan prints it),
# with .item() where it cannot change what the doctor reads: after the iteration's two updates.
GAN = """
import json
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
netD = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3)
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3)
criterion = nn.BCEWithLogitsLoss()
loader = DataLoader(TensorDataset(torch.randn(4096, 8) + 3), batch_size=16)
printed = open("printed.jsonl", "w")
for (real,) in loader:
    netD.zero_grad()
    errD_real = criterion(netD(real), torch.ones(16, 1))
    errD_real.backward()
    fake = netG(torch.randn(16, 4))
    errD_fake = criterion(netD(fake.detach()), torch.zeros(16, 1))
    errD_fake.backward()
    optimizerD.step()
    netG.zero_grad()
    errG = criterion(netD(fake), torch.ones(16, 1))
    errG.backward()
    optimizerG.step()
    printed.write(json.dumps({"D": (errD_real + errD_fake).item(), "G": errG.item()}) + "\\n")
    printed.flush()
"""

# One backward, two optimizers over one model's parameter groups (Muon for the matrices, AdamW
# for the rest): the second update applies the same backward's gradients, so shares its loss.
SHARED = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
matrices = [p for p in model.parameters() if p.dim() == 2]
others = [p for p in model.parameters() if p.dim() < 2]
opt_matrices = torch.optim.SGD(matrices, lr=0.05)
opt_others = torch.optim.AdamW(others, lr=1e-3)
for step in range(100):
    x = torch.randn(32, 8)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    loss.backward()
    opt_matrices.step()
    opt_others.step()
    model.zero_grad()
"""


def _events(run_dir, type_):
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e["data"] for e in map(json.loads, lines) if e["type"] == type_]


def _step_losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "steps.jsonl").read_text().splitlines()]


def test_each_optimizer_of_a_gan_has_its_own_loss_the_scripts_own(tmp_path, monkeypatch):
    from trainspeed.telemetry.rundir import read_run

    monkeypatch.chdir(tmp_path)
    result = run_inline(tmp_path, GAN, steps=25)
    assert result.steps == 25
    printed = [json.loads(line) for line in (tmp_path / "printed.jsonl").read_text().splitlines()]
    # the run stopped at D's 25th update, before the 25th G update and the script's 25th line
    assert len(printed) == 24
    # the step records' loss is D's own (the primary, which closes the steps), not the blend of
    # errG, errD_real and errD_fake; the events say so
    np.testing.assert_allclose(_step_losses(result.run_dir)[:24], [p["D"] for p in printed], rtol=1e-6)
    assert {e["column"] for e in _events(result.run_dir, "update_losses")} == {"optimizerD"}
    # step k holds iteration k's errD and errG, as the script prints them on one line
    from trainspeed.telemetry.update_losses import update_losses

    losses = update_losses(read_run(result.run_dir))
    assert list(losses) == ["optimizerD", "optimizerG"]
    np.testing.assert_allclose(losses["optimizerD"][:24], [p["D"] for p in printed], rtol=1e-6)
    np.testing.assert_allclose(losses["optimizerG"][:24], [p["G"] for p in printed], rtol=1e-6)
    assert math.isnan(losses["optimizerG"][24]) and math.isfinite(losses["optimizerD"][24])
    # the summary and report read each loss apart
    summary = result.summary["losses"]
    assert set(summary) == {"optimizerD", "optimizerG"}
    assert summary["optimizerG"]["first"] == pytest.approx(printed[0]["G"], rel=1e-6)
    assert summary["optimizerD"]["last"] == pytest.approx(losses["optimizerD"][24])



def test_a_fake_batch_through_a_function_is_not_a_micro_batch(tmp_path, monkeypatch):
    """devnag's gan_pytorch.py feeds D `preprocess(G(z).detach())`: a new tensor, no module's
    output, so D's update read as 2 micro-batches (a false accumulation finding) and D's loss
    as the mean of errD_real and errD_fake. D's update is one batch; its loss their sum."""
    from doctor_helpers import ids, observations
    from trainspeed.telemetry.rundir import read_run
    from trainspeed.telemetry.update_losses import update_losses

    monkeypatch.chdir(tmp_path)
    script = GAN.replace("for (real,) in loader:", "for real in [torch.randn(16, 8) + 3 for _ in range(64)]:")
    script = script.replace("netD(fake.detach())", "netD(preprocess(fake.detach()))")
    script = script.replace("printed = open(", "preprocess = lambda t: (t - t.mean()) * 2\nprinted = open(")
    result = run_inline(tmp_path, script, steps=20)
    assert observations(result, "accumulation")[0]["factor"] == 1
    assert "accumulation_for_speed" not in ids(result)
    opts = {o["name"]: o for o in observations(result, "optimizer")}
    assert opts["optimizerD"]["micro_batches"] == 1 and opts["optimizerG"]["micro_batches"] == 1
    printed = [json.loads(line) for line in (tmp_path / "printed.jsonl").read_text().splitlines()]
    losses = update_losses(read_run(result.run_dir))
    np.testing.assert_allclose(losses["optimizerD"][:19], [p["D"] for p in printed], rtol=1e-6)
def test_the_report_shows_each_loss_and_no_blend(tmp_path, monkeypatch):
    from trainspeed.report.plots import Series, plot_loss
    from trainspeed.report.terminal import summary_lines
    from trainspeed.telemetry.rundir import read_run
    from trainspeed.telemetry.summary import summarize

    monkeypatch.chdir(tmp_path)
    result = run_inline(tmp_path, GAN, steps=25)
    run = read_run(result.run_dir)  # read back from the run directory alone
    labels = [label for label, _ in summary_lines(summarize(run))]
    assert "loss optimizerD" in labels and "loss optimizerG" in labels and "loss" not in labels
    svg = plot_loss([Series(label="run", run=run, summary={})], "p0")
    assert "optimizerD" in svg and "optimizerG" in svg


def test_two_optimizers_on_one_backward_share_its_loss(tmp_path, monkeypatch):
    """Recorded per optimizer, read as the one loss it is: the report had two rows of the same
    figures ('loss opt_backbone 2.325 -> 2.303' and 'loss opt_head 2.325 -> 2.303')."""
    from trainspeed.report.terminal import summary_lines
    from trainspeed.telemetry.rundir import read_run
    from trainspeed.telemetry.update_losses import optimizer_series, update_losses

    monkeypatch.chdir(tmp_path)
    result = run_inline(tmp_path, SHARED, steps=30)
    run = read_run(result.run_dir)
    losses = optimizer_series(run)
    assert list(losses) == ["opt_matrices", "opt_others"]
    column = np.array(_step_losses(result.run_dir), dtype=float)
    assert np.isfinite(column).all()
    np.testing.assert_array_equal(losses["opt_matrices"], column)
    # the second optimizer's update of step k is read into the row of step k as well
    np.testing.assert_array_equal(losses["opt_others"][:-1], column[:-1])
    assert update_losses(run) == {}  # one loss: the step records' column says it all
    assert "losses" not in result.summary
    labels = [label for label, _ in summary_lines(result.summary)]
    assert labels.count("loss") == 1 and not any(label.startswith("loss ") for label in labels)


def test_a_shared_loss_beside_another_is_named_by_both(tmp_path, monkeypatch):
    """A GAN whose generator has two optimizers (matrices and the rest) on its one backward:
    two losses, the generator's named by both its optimizers; the tune's parity reads them so."""
    from trainspeed.telemetry.rundir import read_run
    from trainspeed.telemetry.update_losses import members, update_losses
    from trainspeed.tune.optimizer_losses import read_optimizer_losses

    monkeypatch.chdir(tmp_path)
    split_g = GAN.replace(
        "optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3)",
        "optimizerG = torch.optim.Adam([p for p in netG.parameters() if p.dim() == 2], lr=2e-3)\n"
        "optimizerG_bias = torch.optim.SGD([p for p in netG.parameters() if p.dim() < 2], lr=1e-2)",
    ).replace("    optimizerG.step()\n", "    optimizerG.step()\n    optimizerG_bias.step()\n")
    result = run_inline(tmp_path, split_g, steps=25)
    run = read_run(result.run_dir)
    losses = update_losses(run)
    assert list(losses) == ["optimizerD", "optimizerG + optimizerG_bias"]
    assert members("optimizerG + optimizerG_bias") == ["optimizerG", "optimizerG_bias"]
    printed = [json.loads(line) for line in (tmp_path / "printed.jsonl").read_text().splitlines()]
    assert losses["optimizerG + optimizerG_bias"][0] == pytest.approx(printed[0]["G"], rel=1e-6)
    assert set(result.summary["losses"]) == {"optimizerD", "optimizerG + optimizerG_bias"}
    read = read_optimizer_losses(run)
    assert read.primary == "optimizerD" and set(read.end) == {"optimizerD", "optimizerG + optimizerG_bias"}


def test_nonfinite_losses_are_counted_per_optimizer(tmp_path, monkeypatch):
    """G's loss turns NaN from its 10th update on (its value only: `+ nan` leaves the gradients
    finite, so D trains on): the report says so under G's name; before, the blend went NaN
    with it and no loss said whose it was."""
    from trainspeed.report.terminal import summary_lines

    monkeypatch.chdir(tmp_path)
    nan_g = GAN.replace("    errG.backward()\n",
                        "    if len(open('printed.jsonl').read().splitlines()) >= 9:\n"
                        "        errG = errG + float('nan')\n"
                        "    errG.backward()\n")
    result = run_inline(tmp_path, nan_g, steps=20)
    summary = result.summary["losses"]
    assert summary["optimizerG"]["nonfinite"] >= 10 and summary["optimizerD"]["nonfinite"] == 0
    rows = dict(summary_lines(result.summary))
    assert "non-finite" in rows["loss optimizerG"] and "non-finite" not in rows["loss optimizerD"]
