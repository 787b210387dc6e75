"""The ablation's budget arithmetic alone (budget_plan.py)."""
from __future__ import annotations

import pytest

from trainspeed.tune.budget_plan import BudgetPlan

pytestmark = pytest.mark.timeout(10)


def test_settings_are_admitted_until_their_repeats_and_brackets_would_pass_the_budget():
    # 10 s baselines, 2 repeats, a baseline bracket every 2 settings, 40 s for the verification:
    # 20 s first bracket; setting 1 opens a group (20 + 20); setting 2 (20); setting 3 opens (40)
    plan = BudgetPlan(base_wall=10.0, repeats=2, baseline_every=2, budget_s=150.0, reserve_s=40.0)
    assert plan.admit(1.0, 0) is None and plan.planned_s == 60.0
    assert plan.admit(1.0, 0) is None and plan.planned_s == 80.0
    why = plan.admit(1.0, 0)  # 80 + 40 + 40 > 150
    assert why == "does not fit the budget (~40 s for 2 repeats; --budget 3m measures it and the settings above it)"
    assert plan.planned_s == 80.0
    # a compile-like setting priced 3 baselines does not fit either; the figure grows with it
    assert "--budget 4m" in plan.admit(3.0, 0)


def test_a_setting_with_finished_trials_is_always_admitted_and_costs_only_what_is_left():
    plan = BudgetPlan(base_wall=10.0, repeats=2, baseline_every=1, budget_s=10.0, reserve_s=40.0)
    assert plan.admit(1.0, 2) is None and plan.planned_s == 40.0  # only its opening bracket
    assert plan.admit(1.0, 0) is not None


def test_the_budget_a_skipped_setting_asks_for_is_the_whole_one_and_more_than_was_given():
    """siamese_network, `tune --budget 4m`: the first trial took 20.5 s (16 s of it reused as the
    first bracket), so the plan had 235.5 s; num_workers=2 did not fit, and its row said
    '--budget 4m measures it', the budget it had been given."""
    plan = BudgetPlan(base_wall=16.0, repeats=2, baseline_every=2, budget_s=235.5, reserve_s=110.0,
                      whole_budget_s=240.0)
    assert plan.admit(1.0, 0) is None  # 32 + 64 + 110 <= 235.5
    why = plan.admit(1.0, 0)  # 96 + 32 + 110 > 235.5
    assert why is not None and "--budget 5m measures it" in why
    # a 3m tune whose first trial left the plan 155 s: 80 + 40 + 40 = 160 s of the plan's would read
    # '--budget 3m', the budget given; with the 25 s the first trial took beyond it, 4m
    plan = BudgetPlan(base_wall=10.0, repeats=2, baseline_every=2, budget_s=155.0, reserve_s=40.0,
                      whole_budget_s=180.0)
    assert plan.admit(1.0, 0) is None and plan.admit(1.0, 0) is None
    assert "--budget 4m" in plan.admit(1.0, 0)
