"""A reinforcement-learning rollout: no-grad forwards that collect experience, not evaluate.

The doctor times every no-grad forward of the trained model as "eval" (module.py), and the
instrument counts those that look like a rollout (the trained model left in train() mode, no
DataLoader, batches smaller than training's: Lightning's PPO example, `agent(next_obs)` for 2
environments between updates of 64-sample minibatches). That run read "[CRITICAL] Evaluation
takes a large share ... evaluate less often than every 40 steps (every 500)": advice to collect
less data. Where such forwards are most of them, the "eval" time is the data the next updates
train on, with the environments' steps inside it: data time, named as the rollout.
"""

from __future__ import annotations

from trainspeed.doctor.checks.context import CheckContext

MOSTLY = 4
"""Rollout-like forwards at least this many times the evaluation-like ones."""


def is_rollout(ctx: CheckContext) -> bool:
    """The run's "eval" time is a rollout (see the module docstring)."""
    seen = ctx.first("step_boundary") or {}
    rollout, evals = seen.get("rollout_forwards") or 0, seen.get("eval_forwards") or 0
    return rollout > 0 and rollout >= MOSTLY * evals


ROLLOUT_LABEL = "rollout"
"""The phase table's name for the "eval" phase of a rollout: the statement said "rollout" while
the table beside it read "eval" (Lightning's PPO example, reinforce.py)."""


def name_rollout_phase(ctx: CheckContext) -> None:
    """Label the summary's "eval" phase as the rollout it is, for the report's phase table
    (report.terminal.phase_rows): the phase keeps its name in the records and comparisons."""
    phase = (ctx.summary.get("phases") or {}).get("eval")
    if isinstance(phase, dict) and is_rollout(ctx):
        phase["label"] = ROLLOUT_LABEL


ROLLOUT_HELPS = [
    "more environments per forward (vectorized environments: one batched forward for N environments' states)",
    "stepping the environments in worker processes (gymnasium's AsyncVectorEnv) while the policy runs",
    "the rollout's forwards under torch.inference_mode() rather than no_grad",
]
"""What can still help a rollout-bound step."""
