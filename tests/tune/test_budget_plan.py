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
