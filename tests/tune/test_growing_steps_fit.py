"""A script whose steps grow with their index is priced along that growth (trial_fit.py).

pytorch/examples' reinforce.py trains one episode a step and its episodes lengthen as the policy
learns: the tune's first trial ran 25 steps of 12-46 ms, priced 212-step trials at ~6 s, and they
took 25-58 s; bf16 was stopped "far slower" at 30 s against that price."""
from __future__ import annotations

import types

import pytest

from trainspeed.tune.trial_fit import fit_trial, step_growth, trial_length_line

pytestmark = pytest.mark.timeout(30)


def _first(step_times, wall_s=None, warmup_s=0.05):
    return types.SimpleNamespace(step_times=list(step_times), warmup_s=warmup_s,
                                 wall_s=wall_s if wall_s is not None else 1.0 + warmup_s + sum(step_times))


def test_steps_that_grow_with_their_index_are_priced_along_the_line():
    steps = [0.012 + 0.0014 * k for k in range(25)]  # 12 -> 46 ms, as reinforce.py's first trial
    start, slope = step_growth(steps)
    assert start == pytest.approx(0.012) and slope == pytest.approx(0.0014)
    fit = fit_trial(_first(steps), warmup_steps=1, trials=1, budget_left=10_000, max_steps=212, first_warmup=1)
    assert fit.measure_steps == 212 and fit.growth_s == pytest.approx(0.0014)
    # 212 steps along the line: 212 x 12 ms + 1.4 ms x 212 x 211 / 2 = 34 s (the median priced 6.6 s)
    assert fit.price_s == pytest.approx(1.0 + 0.05 + 0.012 * 212 + 0.0014 * 212 * 211 / 2, rel=1e-6)
    assert "each ~1 ms longer than the one before" in trial_length_line(_first(steps), fit, 1)


def test_a_budget_cuts_growing_steps_to_the_count_whose_growing_cost_fits():
    steps = [0.012 + 0.0014 * k for k in range(25)]
    fit = fit_trial(_first(steps), warmup_steps=1, trials=10, budget_left=100.0, max_steps=212, first_warmup=1)
    per_trial = 10.0 - 1.0 - 0.05
    n = fit.measure_steps
    cost = lambda m: 0.012 * m + 0.0014 * m * (m - 1) / 2  # noqa: E731
    assert cost(n) <= per_trial < cost(n + 1), n


@pytest.mark.parametrize("steps", [
    [0.020] * 30,  # level
    [0.020, 0.060, 0.021, 0.019, 0.020, 0.022, 0.020, 0.021, 0.020, 0.019, 0.020, 0.021],  # one slow step
    [0.030 - 0.0005 * k for k in range(30)],  # shrinking
])
def test_steps_that_do_not_grow_keep_their_median_price(steps):
    assert step_growth(steps) is None
    fit = fit_trial(_first(steps), warmup_steps=1, trials=1, budget_left=10_000, max_steps=100, first_warmup=1)
    assert fit.growth_s == 0.0
    import statistics

    assert fit.price_s == pytest.approx(_first(steps).wall_s - sum(steps) + 100 * statistics.median(steps))
