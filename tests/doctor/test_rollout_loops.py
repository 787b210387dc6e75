"""A PPO loop (Lightning's examples/fabric/reinforcement_learning/train_torch.py, distilled): a
rollout of no-grad forwards of the trained agent, left in train() mode, on 2 environments'
states, with the environments stepped between them; then epochs of minibatch updates on what
it collected. No DataLoader. The doctor read the rollout as evaluation: "[CRITICAL] Evaluation
takes a large share of the training time ... evaluate less often than every 40 steps (every
500)", and measured `--knobs eval_every`. The same loop with `agent.eval()` around a no-grad
pass over the training batch size is an evaluation, and stays one."""
from __future__ import annotations

import json
import textwrap

import pytest

from doctor_helpers import ids, observations, run_inline

pytestmark = pytest.mark.timeout(120)

LOOP = """
import torch
from torch import nn
torch.manual_seed(0)
N_ENVS, ROLLOUT, MINIBATCH = 2, 32, 16


def env_step(actions):  # the simulation: host work outside the training phases
    sum(i * i for i in range(20000))
    return torch.randn(N_ENVS, 4), torch.ones(N_ENVS)


agent = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))
optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3)
obs = torch.randn(N_ENVS, 4)
for update in range(1000):
    states, actions = [], []
    if EVAL:
        agent.eval()
    for step in range(ROLLOUT):
        with torch.no_grad():
            logits = agent(obs if not EVAL else torch.randn(MINIBATCH, 4))
            action = logits.argmax(-1)[:N_ENVS]
            if EVAL:  # the evaluation's own work, inside its no_grad block
                obs, reward = env_step(action)
        states.append(obs)
        actions.append(action)
        if not EVAL:  # outside it: the rollout runs until training resumes
            obs, reward = env_step(action)
    agent.train()
    data, target = torch.cat(states), torch.cat(actions)
    for epoch in range(2):
        for idx in torch.randperm(len(data)).split(MINIBATCH):
            loss = nn.functional.cross_entropy(agent(data[idx]), target[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""


@pytest.fixture
def ppo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return lambda evaluation, rollout=32: run_inline(
        tmp_path, f"EVAL = {evaluation}\n" + textwrap.dedent(LOOP).replace("ROLLOUT, MINIBATCH = 2, 32, 16",
                                                                        f"ROLLOUT, MINIBATCH = 2, {rollout}, 16"),
        steps=40)


def test_a_rollout_is_the_data_not_an_evaluation(ppo):
    result = ppo(False)
    seen = observations(result, "step_boundary")[0]
    # 4 rollouts after the first update, 32 forwards each: the first of each is not yet a run
    assert seen["rollout_forwards"] >= 4 * 31 and seen["eval_forwards"] <= 5, seen
    assert "evaluation_share" not in ids(result)
    goes = json.loads((result.run_dir / "report.json").read_text())["time_goes"]
    assert goes["bound"] == "data" and "collecting experience" in goes["statement"], goes
    assert "rollout" in goes["statement"] and "eval " not in goes["statement"], goes["statement"]
    assert any("vectorized environments" in h for h in goes["helps"]), goes["helps"]
    # no gymnasium environment was timed: stepping environments in workers is not offered
    assert not any("AsyncVectorEnv" in h for h in goes["helps"]), goes["helps"]
    assert "eval_every" not in (goes["verify_with"] or "") and "num_workers" not in (goes["verify_with"] or "")
    # the phase table beside that statement names the time as it does (it read "eval")
    from trainspeed.report.terminal import phase_rows

    summary = json.loads((result.run_dir / "report.json").read_text())["summary"]
    names = [name for name, _, _ in phase_rows(summary)]
    assert "rollout" in names and "eval" not in names, names


def test_the_same_loop_evaluating_in_eval_mode_is_still_an_evaluation(ppo):
    result = ppo(True)
    seen = observations(result, "step_boundary")[0]
    assert seen["rollout_forwards"] == 0 and seen["eval_forwards"] > 0, seen
    assert "evaluation_share" in ids(result)
    from trainspeed.report.terminal import phase_rows

    summary = json.loads((result.run_dir / "report.json").read_text())["summary"]
    assert "eval" in [name for name, _, _ in phase_rows(summary)]


def test_a_steps_flag_counted_per_rollout_is_not_the_run_length():
    """PPO's --num-steps is the rollout's length per environment; the tune raised it to 406 "to
    measure the steps above" (changing what each update trains on)."""
    import argparse

    from trainspeed.doctor.checks.script_flags import find_flag
    from trainspeed.doctor.instrument.flags import describe_parser

    parser = argparse.ArgumentParser()
    parser.add_argument("--num-steps", type=int, default=128,
                        help="the number of steps to run in each environment per policy rollout")
    parser.add_argument("--total-timesteps", type=int, default=2**16, help="total timesteps of the experiments")
    rows = describe_parser(parser, parser.parse_args([]))
    assert rows[0]["help"].startswith("the number of steps")
    assert find_flag(rows, "run_length") is None
    parser.add_argument("--max-steps", type=int, default=100, help="how many optimizer steps to train for")
    rows = describe_parser(parser, parser.parse_args([]))
    assert find_flag(rows, "run_length")["option"] == "--max-steps"


def test_one_no_grad_prediction_per_update_is_no_rollout(ppo):
    """pytorch/examples' time_sequence_prediction: a prediction under no_grad on 3 test series
    (train() mode, no DataLoader, fewer than the 97 trained on) after every update, then a
    figure drawn outside the no_grad block: an evaluation whose figure is no part of it."""
    result = ppo(False, rollout=1)
    seen = observations(result, "step_boundary")[0]
    assert seen["rollout_forwards"] == 0 and seen["eval_forwards"] > 0, seen
    goes = json.loads((result.run_dir / "report.json").read_text())["time_goes"]
    assert "collecting experience" not in goes["statement"], goes["statement"]
