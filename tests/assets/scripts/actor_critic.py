"""An actor-critic loop (one optimizer over two models, a policy loss and a value loss
backwarded separately) on a simulated environment, that evaluates the policy after every
update: 16 greedy rollouts under torch.no_grad() with the models in eval() mode. Planted: the
evaluation every step."""
import argparse

import torch
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    torch.manual_seed(0)
    actor = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8))
    critic = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 1))
    optimizer = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=3e-4)
    dynamics = torch.randn(8, 32) * 0.1
    for step in range(args.steps):
        state = torch.randn(256, 32)
        logits = actor(state)
        dist = torch.distributions.Categorical(logits=logits)
        action = dist.sample()
        reward = (dynamics[action] * state).sum(-1)
        value = critic(state).squeeze(-1)
        advantage = (reward - value).detach()
        policy_loss = -(dist.log_prob(action) * advantage).mean()
        value_loss = (reward - value).pow(2).mean()
        optimizer.zero_grad()
        policy_loss.backward()
        value_loss.backward()
        optimizer.step()
        # planted: a full evaluation after every update
        actor.eval(); critic.eval()
        with torch.no_grad():
            s = torch.randn(64, 32)
            total = 0.0
            for _ in range(16):
                a = actor(s).argmax(-1)
                total += float((dynamics[a] * s).sum())
                s = torch.tanh(s + dynamics[a])
        actor.train(); critic.train()


if __name__ == "__main__":
    main()
