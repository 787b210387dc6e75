"""A trial the budget's end cut is run again by the resumed tune the note asks for.

The note under a tune whose budget ran out says "Rerun with the same --out and a larger --budget
to continue from the finished trials"; the resumed tune reused the cut trial as it was stored,
ran nothing, and read bf16 "skipped: stopped at the end of the tune's budget" again, whatever
the budget."""

from __future__ import annotations

import pytest

from trainspeed.tune import stats
from trainspeed.tune.search import Tuner, TuneOptions
from trainspeed.tune.store import TrialStore
from trainspeed.tune.trials import BUDGET_END, TrialResult

from tune_fakes import FakeRunner

pytestmark = pytest.mark.timeout(60)

BF16 = "precision.mode=bf16-mixed"


class BudgetCuts(FakeRunner):
    """The trials `cut(overrides)` picks are cut by the budget's end."""

    def __init__(self, *a, cut, **kw):
        super().__init__(*a, **kw)
        self.cut = cut

    def __call__(self, req):
        res = super().__call__(req)
        if self.cut(req.overrides):
            return TrialResult(ok=False, key=req.key, label=req.label, repeat=req.repeat, wall_s=5.0,
                               error=f"{BUDGET_END} (3 s left when it started)")
        return res


def bf16_only(overrides) -> bool:
    return BF16 in overrides


def never(overrides) -> bool:
    return False


def _tune(base_config, cpu, tmp_path, runner):
    options = TuneOptions(budget_s=10_000, knobs=["precision"], repeats=2, verify_repeats=1)
    return Tuner(base_config=base_config, base_hash="h", device=cpu, runner=runner, store=TrialStore(tmp_path),
                 options=options, say=lambda s: None).run()


def test_the_resumed_tune_measures_what_the_budget_cut(base_config, cpu, tmp_path):
    first = _tune(base_config, cpu, tmp_path, BudgetCuts({BF16: 0.5}, cut=bf16_only))
    assert next(r for r in first.ablation if r.setting == "bf16-mixed").verdict == stats.SKIPPED
    runner = BudgetCuts({BF16: 0.5}, cut=never)
    again = _tune(base_config, cpu, tmp_path, runner)
    bf16 = next(r for r in again.ablation if r.setting == "bf16-mixed")
    assert bf16.verdict == stats.FASTER, (bf16.verdict, bf16.note)
    assert [c.repeat for c in runner.calls if c.overrides == (BF16,)][:2] == [0, 1]  # run again, not reused
    # what finished is reused: no baseline trial of the ablation ran again
    assert not any(c.overrides == () and c.repeat < 2 for c in runner.calls)


def test_a_baseline_the_budget_cut_runs_again_in_the_resumed_tune(base_config, cpu, tmp_path):
    from trainspeed.tune.budget_plan import BaselineOutOfBudget

    with pytest.raises(BaselineOutOfBudget):  # exit 3: "a larger --budget measures it"
        _tune(base_config, cpu, tmp_path, BudgetCuts({BF16: 0.5}, cut=lambda overrides: True))
    again = _tune(base_config, cpu, tmp_path, BudgetCuts({BF16: 0.5}, cut=never))
    assert next(r for r in again.ablation if r.setting == "bf16-mixed").verdict == stats.FASTER


def test_a_setting_an_earlier_tune_saw_crash_is_run_once_more_by_the_resumed_tune(base_config, cpu, tmp_path):
    """A crash can be transient (a library mid-upgrade, trainspeed's own import caught mid-edit,
    a neighbour's OOM kill): a resumed tune reused it as the setting's verdict, 'failed', for good."""
    first = _tune(base_config, cpu, tmp_path, FakeRunner({BF16: 0.5}, fail=(BF16,)))
    assert next(r for r in first.ablation if r.setting == "bf16-mixed").verdict == stats.FAILED
    runner = FakeRunner({BF16: 0.5})
    again = _tune(base_config, cpu, tmp_path, runner)
    assert next(r for r in again.ablation if r.setting == "bf16-mixed").verdict == stats.FASTER
    # a crash in this tune is still its verdict: run once more, it crashes again, and stays so
    still = _tune(base_config, cpu, tmp_path / "other", FakeRunner({BF16: 0.5}, fail=(BF16,)))
    runner = FakeRunner({BF16: 0.5}, fail=(BF16,))
    again = _tune(base_config, cpu, tmp_path / "other", runner)
    assert next(r for r in again.ablation if r.setting == "bf16-mixed").verdict == stats.FAILED
    assert sum(1 for c in runner.calls if c.overrides == (BF16,)) == 1, [(c.overrides, c.repeat) for c in runner.calls]
    assert next(r for r in still.ablation if r.setting == "bf16-mixed").verdict == stats.FAILED
