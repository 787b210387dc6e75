"""Reinforcement-learning loops whose step is an episode (pytorch/examples'
reinforcement_learning/reinforce.py and actor_critic.py, distilled; a small Python environment
stands in for gymnasium's CartPole): one forward per environment step on a batch of one state
((1, 4) after `unsqueeze(0)`, or the bare (4,) state), an action read back with `.item()`, a
Categorical distribution per action, then one backward and one update per episode.

What the doctor once read there: "gradient accumulation over 100 micro-batches" (one backward
per update: the forwards were counted as micro-batches); samples capped at 64 per step (the
input shapes kept per step), and 4 samples per forward of a (4,) state (its features read as a
batch); the distributions' own argument checks named as the user's `if tensor:`."""
from __future__ import annotations

import json
import textwrap

import pytest

from doctor_helpers import ids, observations, run_inline

pytestmark = pytest.mark.timeout(120)

LOOP = """
import torch
from torch import nn
from torch.distributions import Categorical
torch.manual_seed(0)


class Env:
    # episodes of exactly LENGTH steps: the step's samples are known
    def reset(self):
        self.t = 0
        return [0.1, 0.2, 0.3, 0.4]

    def step(self, action):
        self.t += 1
        sum(i * i for i in range(3000))  # the simulation: host work outside the training phases
        return [0.1 * action, 0.2, 0.3, 0.4], 1.0, self.t >= LENGTH + GROW * episode


policy = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2), nn.Softmax(dim=-1))
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
env = Env()
for episode in range(1000):
    state, log_probs, done = env.reset(), [], False
    while not done:
        x = torch.tensor(state)
        probs = policy(x.unsqueeze(0) if UNSQUEEZE else x)
        m = Categorical(probs)
        action = m.sample()
        log_probs.append(m.log_prob(action))
        state, reward, done = env.step(action.item())
    optimizer.zero_grad()
    loss = -torch.cat([lp.reshape(1) for lp in log_probs]).sum()
    loss.backward()
    optimizer.step()
"""


@pytest.fixture
def episodes(tmp_path, monkeypatch):
    from torch.distributions import Distribution

    monkeypatch.chdir(tmp_path)
    # a fresh process's default: torch.compile, run earlier in this test process (DeepSpeed's
    # import does), turns the distributions' checks off for the whole process (dynamo's patches)
    monkeypatch.setattr(Distribution, "_validate_args", True)

    def run(length: int, unsqueeze: bool, grow: int = 0, steps: int = 12):
        source = f"LENGTH = {length}\nUNSQUEEZE = {unsqueeze}\nGROW = {grow}\n" + textwrap.dedent(LOOP)
        return run_inline(tmp_path, source, steps=steps)

    return run


def _samples(result) -> list[int]:
    rows = [json.loads(line) for line in (result.run_dir / "steps.jsonl").read_text().splitlines()]
    return [r["samples"] for r in rows if "step" in r]


@pytest.mark.parametrize("unsqueeze", [True, False], ids=["batch-of-one", "bare-state"])
def test_an_episode_is_one_update_and_its_env_steps_are_the_samples(episodes, unsqueeze):
    result = episodes(100, unsqueeze)
    acc = observations(result, "accumulation")[0]
    assert acc["factor"] == 1, acc  # one backward per update: no micro-batches
    assert "accumulation_for_speed" not in ids(result)
    opt = next(o for o in observations(result, "optimizer"))
    assert opt["micro_batches"] == 1, opt
    # 100 forwards of one state each (past the 64 input shapes once kept per step)
    assert set(_samples(result)) == {100}, _samples(result)


def test_a_distributions_argument_checks_are_named_with_the_keyword_that_removes_them(episodes):
    result = episodes(20, True)
    finding = next(f for f in result.findings if f["id"] == "host_syncs")
    # Categorical(probs) and m.log_prob(action) check their arguments: 2 reads per env step
    assert "Categorical(probs)" in finding["evidence"] and "validate_args" in finding["evidence"], finding
    assert "validate_args=False" in finding["recommendation"], finding
    assert "compute their constraints on every call" in finding["evidence"], finding  # not "nothing" on a CPU
    assert "keep the value on the device" not in finding["recommendation"], finding
    assert "env.step(action.item())" in finding["recommendation"]  # the read the environment needs stays
    # 3 reads per env step, 20 env steps: 60 a step; the checks' 40 go, 20 stay
    assert "from 60 to about 20" in finding["verify_with"], finding["verify_with"]
    totals = observations(result, "call_sites")[0]["totals"]["sync"]
    assert totals["validate_args"]["count"] == 2 * totals["item"]["count"], totals


def test_an_overhead_bound_episode_without_logging_is_not_told_to_log_less(episodes):
    result = episodes(20, True)
    goes = json.loads((result.run_dir / "report.json").read_text())["time_goes"]
    assert goes["bound"] == "overhead", goes
    helps = "; ".join(goes["helps"])
    # no logging, checkpoint or evaluation phase to thin: nothing named, nothing to measure
    assert "less often" not in helps and "environment's steps" in helps, helps
    assert "log_every" not in (goes["verify_with"] or "") and "eval_every" not in (goes["verify_with"] or ""), goes


def test_episodes_that_lengthen_are_no_step_time_growth(episodes):
    # 10 -> 247 environment steps an episode over 80 updates, the time per environment step level
    result = episodes(10, True, grow=3, steps=80)
    samples = _samples(result)
    assert samples[-1] >= 20 * samples[0], samples
    summary = json.loads((result.run_dir / "report.json").read_text())["summary"]
    trend = summary.get("trend")
    assert not trend or trend.get("samples_per_step"), trend  # judged per sample, if at all
    assert "step_time_growth" not in ids(result)  # nor its "cannot tell" form on a busy machine


def test_work_factors_scale_only_steps_whose_samples_changed():
    import numpy as np

    from trainspeed.telemetry.work_scale import per_sample, work_factors

    assert work_factors(np.full(40, 64.0)) is None
    assert work_factors(np.r_[np.full(39, 64.0), 8.0]) is None  # a short last batch
    steps = np.arange(1, 41)
    samples = np.linspace(10, 200, 40)
    times = samples * 1e-3  # 1 ms per sample throughout
    scaled = per_sample(steps[::2], times[::2], {"other": times[::2]}, steps, samples)
    assert scaled is not None
    level, phases, quarters = scaled
    assert np.allclose(level, level[0]) and np.allclose(phases["other"], level)
    assert quarters[0] < 50 and quarters[1] > 150


def test_the_checks_lead_the_advice_when_a_read_of_the_same_count_is_listed_first():
    from trainspeed.doctor.checks.syncs import _validate_fix

    item = {"kind": "item", "site": "train.py:34", "code": "env.step(action.item())", "count": 20}
    checks = [{"kind": "validate_args", "site": f"train.py:{n}", "code": code, "count": 20}
              for n, code in ((30, "m = Categorical(probs)"), (32, "log_probs.append(m.log_prob(action))"))]
    advice = _validate_fix([item, *checks])  # a tie, ordered by the time inside the reads
    assert advice is not None and "validate_args=False" in advice and "env.step(action.item())" in advice
    assert _validate_fix([{**item, "count": 100}, *checks]) is None  # the item reads lead
