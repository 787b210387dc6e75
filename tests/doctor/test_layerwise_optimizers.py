"""Several optimizers that take turns by phase, not by iteration. pytorch/examples'
mnist_forward_forward trains each layer with its own Adam, one layer after the other: the
doctor counted only the first optimizer's steps (100 of 200), and the second layer's training
ran past its --steps unseen. Another optimizer that keeps stepping alone, far longer than it
ever did between the first one's steps, now takes over the step boundary; a WGAN's critic,
5 steps per generator step for ever, never does."""

from __future__ import annotations

import pytest

from doctor_helpers import run_inline

pytestmark = pytest.mark.timeout(120)

LAYERWISE = '''
import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(64, 16)
layers = [nn.Linear(16, 16), nn.Linear(16, 16)]
opts = [torch.optim.Adam(layer.parameters(), lr=1e-3) for layer in layers]
h = x
for layer, opt in zip(layers, opts):
    for epoch in range(30):
        loss = layer.forward(h).pow(2).mean()   # the module's forward, called directly
        opt.zero_grad()
        loss.backward()
        opt.step()
    h = layer(h).detach()
'''

CRITIC = '''
import torch
from torch import nn

torch.manual_seed(0)
gen, critic = nn.Linear(8, 8), nn.Linear(8, 1)
opt_g = torch.optim.Adam(gen.parameters(), lr=1e-4)
opt_c = torch.optim.Adam(critic.parameters(), lr=1e-4)
for it in range(12):
    opt_g.zero_grad()
    (-critic(gen(torch.randn(16, 8))).mean()).backward()
    opt_g.step()                       # the generator steps first: the primary
    for _ in range(5):                 # then the critic, 5 times per generator step
        opt_c.zero_grad()
        (critic(gen(torch.randn(16, 8)).detach()).mean() - critic(torch.randn(16, 8)).mean()).backward()
        opt_c.step()
'''


# devnag's gan_pytorch.py: 20 D updates, then 20 G updates, per epoch. A step's samples are
# those of the first trained module's (D's) forwards: a step with only G's updates has none.
BLOCKS = '''
import torch
from torch import nn

torch.manual_seed(0)
d, g = nn.Linear(8, 1), nn.Linear(8, 8)  # d: the first trained module
opt_d = torch.optim.SGD(d.parameters(), lr=1e-3)
opt_g = torch.optim.SGD(g.parameters(), lr=1e-3)
for epoch in range(3):
    for _ in range(15):
        opt_d.zero_grad()
        d(torch.randn(4, 8)).mean().backward()
        opt_d.step()
    for _ in range(15):
        opt_g.zero_grad()
        g(torch.randn(8, 8)).mean().backward()
        opt_g.step()
'''


def test_layerwise_optimizers_hand_the_step_over(tmp_path):
    result = run_inline(tmp_path, LAYERWISE, steps=None)
    # 30 steps of the first layer; the second's 11th closes the step that held its first 11
    # (warm-up: not a step's time), then its 19 others
    assert result.steps == 30 + 1 + 19, result.steps
    # no sample was counted in a measured step: the rate is unknown, not 0 samples/s
    assert result.summary["samples_per_s"] is None


def test_a_critic_that_steps_five_times_per_generator_step_keeps_one_step_per_iteration(tmp_path):
    result = run_inline(tmp_path, CRITIC, steps=None)
    assert result.steps == 12


def test_forwards_no_module_call_showed_are_compute_not_overhead(tmp_path):
    """`layer.forward(h)` called directly opens no forward phase: its time is in "other", which
    the top statement read as the host's overhead (mnist_forward_forward: 'overhead 45%')."""
    import json

    result = run_inline(tmp_path, LAYERWISE, steps=None)
    goes = json.loads((result.run_dir / "report.json").read_text())["time_goes"]
    assert goes["bound"] == "compute" and "the forward outside module calls, timed as other" in goes["statement"]
    assert goes["shares"]["overhead"] < 0.05 < goes["shares"]["compute"]
    # the tune's bf16 and compile apply at module calls: it would skip both, so the top does not
    # offer that measurement; it says what lets them apply. Its per-layer SGD loops are measured
    # with the fused kernel (the optimizer finding): that knob needs no module call.
    assert goes["helps"][0].startswith("calling the module (`layer(x)`)")
    assert goes["verify_with"].startswith("trainspeed tune --knobs fused_optimizer -- python "), goes["verify_with"]


def test_optimizers_that_take_turns_in_blocks_keep_the_first_ones_step(tmp_path):
    """The boundary went D, G, D, G ... at each block's 11th update (110 steps for 200 updates
    of gan_pytorch.py, every 10th one warm-up). Once D steps again after handing over to G, the
    loop alternates: the boundary is D's again, for good."""
    import json

    result = run_inline(tmp_path, BLOCKS, steps=None)
    records = [json.loads(line) for line in (result.run_dir / "steps.jsonl").read_text().splitlines()]
    # epoch 1: D's 15 steps; G's 11th closes one (warm-up), its last 4 their own; then D's 15
    # updates of epochs 2 and 3 close a step each (G's block of epoch 3 closes none)
    assert result.steps == 15 + 1 + 4 + 15 + 15, result.steps
    assert [r["samples"] for r in records[15:21]] == [0, 0, 0, 0, 0, 4]  # G closed 16-20
    assert {r["samples"] for r in records[20:]} == {4}  # one D batch each: D closes every step
    warm = [r["step"] for r in records if r["warmup"]]
    assert 16 in warm and not [step for step in warm if step > 16], warm
