"""A script tune's first baseline trial prices the others but opens no round (Tuner.first_bracket).

pytorch/examples' reinforce.py trains an episode a step and its episodes lengthen as it learns:
the first trial's 25 short episodes (0.90 ms/sample, 1.3 s) were round 1's left bracket for
trials of 300 longer ones (0.72 ms/sample, 51 s), and the fused setting, run before any trial of
that length, was stopped "far slower" at 30 s against a 7 s price while it took 51 s."""

from __future__ import annotations

import pytest

from trainspeed.tune.search import Tuner, TuneOptions
from trainspeed.tune.store import TrialStore
from trainspeed.tune.trials import SLOW_CUTOFF

from tune_fakes import FakeRunner

pytestmark = pytest.mark.timeout(60)

FUSED, FOREACH = "optim.implementation=fused", "optim.implementation=foreach"
PRICING, SIZED = "2+25 steps, cut at 24 s", "1+300 steps"


class ScriptLike(FakeRunner):
    """Trials carry their shape as ScriptRunner's do; the first (pricing) trial is short and its
    steps slower per sample than the sized trials' (the early episodes)."""

    def __init__(self, effects, *, first_wall: float, sized_wall: float, **kw):
        super().__init__(effects, wall_s=sized_wall, **kw)
        self.shape = PRICING
        self.first_wall = first_wall

    def __call__(self, req):
        res = super().__call__(req)
        res.shape = self.shape
        if len(self.calls) == 1:
            res.wall_s = self.first_wall
            res.step_times = [t * 1.25 for t in res.step_times]
        return res


def _tune(runner, tmp_path, base_config, cpu, price_s: float, **opts):
    def fit(base, trials):  # as the script session sizes its trials after the first
        runner.shape = SIZED
        return price_s

    options = TuneOptions(budget_s=10_000, knobs=["fused_optimizer"], **opts)
    tuner = Tuner(base_config=base_config, base_hash="h", device=cpu, runner=runner, store=TrialStore(tmp_path),
                  options=options, say=lambda s: None, fit_trials=fit)
    return tuner, tuner.run()


def test_a_sized_baseline_opens_the_first_round_and_the_pricing_trial_is_no_bracket(base_config, cpu, tmp_path):
    runner = ScriptLike({}, first_wall=1.3, sized_wall=51.0)
    tuner, result = _tune(runner, tmp_path, base_config, cpu, price_s=7.0, repeats=2, verify_repeats=0)
    assert tuner.first_bracket == 1
    calls = [(c.overrides, c.repeat) for c in runner.calls]
    assert calls[:2] == [((), 0), ((), 1)]  # the pricing trial, then a sized baseline before any setting
    # no comparison reads the pricing trial: the settings change nothing, and none reads faster
    # from its 1.25x slower steps
    for row in result.ablation:
        assert row.speedup is not None and abs(row.speedup - 1.0) < 0.05, (row.setting, row.speedup)
    # the first setting's cutoff follows the sized baseline that ran before it (51 s), not the
    # 7 s the first trial priced: "far slower" is SLOW_CUTOFF times what a plain trial takes
    first_setting = next(c for c in runner.calls if c.overrides)
    assert first_setting.timeout_s >= SLOW_CUTOFF * 51.0


def test_a_first_trial_of_the_sized_length_still_opens_the_first_round(base_config, cpu, tmp_path):
    runner = ScriptLike({}, first_wall=5.0, sized_wall=5.0)
    runner.shape = SIZED  # nothing to size: the first trial ran as the others do
    tuner, _ = _tune(runner, tmp_path, base_config, cpu, price_s=5.0, repeats=2, verify_repeats=0)
    assert tuner.first_bracket == 0
    calls = [(c.overrides, c.repeat) for c in runner.calls]
    assert calls[0] == ((), 0) and calls[1][0] != ()  # repeat 0 is round 1's opening bracket


def test_settings_are_admitted_at_what_a_sized_trial_took(base_config, cpu, tmp_path):
    """The first trial priced trials at 7 s; sized, they take 51 s. Priced at 7 s, the plan
    admitted every setting and started trials the budget could not pay for."""
    runner = ScriptLike({}, first_wall=1.3, sized_wall=51.0)
    said: list[str] = []

    def fit(base, trials):
        runner.shape = SIZED
        return 7.0

    options = TuneOptions(budget_s=300, knobs=["fused_optimizer", "precision"], repeats=2, verify_repeats=1)
    tuner = Tuner(base_config=base_config, base_hash="h", device=cpu, runner=runner, store=TrialStore(tmp_path),
                  options=options, say=said.append, fit_trials=fit)
    tuner.run()
    assert any("took 51 s, not the ~7 s the first trial priced" in s for s in said), said
    assert tuner.spent <= 300, [(c.overrides, c.repeat) for c in runner.calls]


def test_the_opening_bracket_run_before_the_plan_is_not_paid_twice(base_config, cpu, tmp_path):
    """1.3 s first trial + 51 s opening bracket spent; one setting and its closing bracket take
    102 s more: 155 s in all, inside a 160 s budget. Counted again in the plan, the opening
    bracket left the setting out ('does not fit the budget')."""
    runner = ScriptLike({}, first_wall=1.3, sized_wall=51.0)

    def fit(base, trials):
        runner.shape = SIZED
        return 51.0

    options = TuneOptions(budget_s=160, knobs=["precision"], repeats=1, verify_repeats=0)
    tuner = Tuner(base_config=base_config, base_hash="h", device=cpu, runner=runner, store=TrialStore(tmp_path),
                  options=options, say=lambda s: None, fit_trials=fit)
    result = tuner.run()
    bf16 = next(r for r in result.ablation if r.setting == "bf16-mixed")
    assert bf16.speedup is not None, bf16.note
    assert tuner.spent <= 160
