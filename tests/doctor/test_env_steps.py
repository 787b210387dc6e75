"""An RL loop's environment steps, timed and named (doctor/instrument/environments.py).

reinforce.py's report said "other 58 %: ... an environment's steps, ..." without knowing how
much was CartPole's. A stand-in `gymnasium` package (the real one is no dependency of the
tests) with `make` and `vector.SyncVectorEnv`, as the scripts call them."""
from __future__ import annotations

import json
import textwrap

import pytest

from doctor_helpers import observations, run_inline

pytestmark = pytest.mark.timeout(120)

FAKE_GYMNASIUM = '''
class Env:
    t = 0

    def reset(self, seed=None):
        self.t = 0
        return [0.1, 0.2, 0.3, 0.4], {}

    def step(self, action):
        self.t += 1
        sum(i * i for i in range(20000))  # the simulation
        return [0.1, 0.2, 0.3, 0.4], 1.0, self.t >= 30, False, {}


class Wrapper(Env):
    def __init__(self, env):
        self.env = env

    def reset(self, seed=None):
        return self.env.reset(seed)

    def step(self, action):
        return self.env.step(action)


def make(name, **kwargs):
    return Wrapper(Env())
'''

FAKE_VECTOR = '''
class SyncVectorEnv:
    def __init__(self, fns):
        self.envs = [fn() for fn in fns]

    def step(self, actions):
        return [env.step(a) for env, a in zip(self.envs, actions)]
'''

LOOP = """
import torch
from torch import nn
import gymnasium as gym
torch.manual_seed(0)
policy = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
env = gym.make("CartPole-v1")
vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
for episode in range(1000):
    (state, _), done, outs = env.reset(), False, []
    while not done:
        out = policy(torch.tensor(state).unsqueeze(0))
        outs.append(out)
        state, reward, done, _, _ = env.step(int(out.argmax()))
        if VECTOR:
            vec.step([0, 1])
    loss = torch.cat(outs).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("vector", [False, True], ids=["make", "vector"])
def test_the_environment_steps_are_timed_at_the_scripts_line_and_named(tmp_path, monkeypatch, vector):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gymnasium").mkdir()
    (tmp_path / "gymnasium" / "__init__.py").write_text(FAKE_GYMNASIUM + "\nfrom gymnasium import vector\n")
    (tmp_path / "gymnasium" / "vector.py").write_text(FAKE_VECTOR)
    result = run_inline(tmp_path, f"VECTOR = {vector}\n" + textwrap.dedent(LOOP), steps=8)
    assert result.exit_code == 0 and result.steps == 8, result.traceback
    sites = observations(result, "call_sites")[0]
    rows = [r for r in sites["rows"] if r["category"] == "env"]
    made = next(r for r in rows if "env.step(int(out.argmax()))" in r["code"])
    assert made["count"] == 8 * 30, rows  # 30 steps an episode; the wrapper's inner step not again
    if vector:  # the vector step once per call, its two made envs' steps inside it not counted
        assert next(r for r in rows if "vec.step" in r["code"])["count"] == 8 * 30, rows
    assert sites["totals"]["env"]["step"]["count"] == 8 * 30 * (2 if vector else 1)
    goes = json.loads((result.run_dir / "report.json").read_text())["time_goes"]
    helps = "; ".join(goes["helps"])
    assert "the environment's steps take" in helps and "calls a step" in helps, helps
    assert ("vec.step([0, 1])" if vector else "env.step(int(out.argmax()))") in helps, helps  # the busiest line
