"""A crash of the baseline after it ran is no verdict on it: the rounds keep their reference."""
from __future__ import annotations

import pytest

from test_search import BF16, tuner
from trainspeed.tune import stats
from tune_fakes import FakeRunner

pytestmark = pytest.mark.timeout(60)


class CrashOnce(FakeRunner):
    """The baseline's trial of one repeat crashes (an import error of the tool itself, mid-edit)."""

    def __init__(self, effects, crash_repeat, **kw):
        super().__init__(effects, **kw)
        self.crash_repeat = crash_repeat

    def __call__(self, req):
        if not req.overrides and req.repeat == self.crash_repeat:
            self.calls.append(req)
            return self._crash(req)
        return super().__call__(req)

    @staticmethod
    def _crash(req):
        from trainspeed.tune.trials import TrialResult

        return TrialResult(key=req.key, label=req.label, repeat=req.repeat, ok=False, wall_s=0.3,
                           error="exit code 1: ImportError: cannot import name 'x' (at runner.py:256)")


def test_a_baseline_that_crashed_once_after_running_still_runs_its_later_rounds(base_config, cpu, tmp_path):
    """super_resolution: one baseline trial crashed, after 13 that ran; every later round and
    each resumed tune's verification skipped the baseline, so compile's verification had no pair
    and read "the budget ran out before a fresh verification" with 95 s of 6 minutes left."""
    runner = CrashOnce({BF16: 0.5}, crash_repeat=2)
    result = tuner(base_config, cpu, runner, tmp_path, knobs=["precision"], repeats=3).run()
    assert result.final is not None and result.final.verdict == stats.FASTER, (result.final.verdict,
                                                                              result.final.note)
    assert any(not c.overrides and c.repeat > 2 for c in runner.calls)  # the baseline ran again
    from trainspeed.tune import far_slower

    crash = CrashOnce._crash(runner.calls[0])
    ran = runner(runner.calls[0])
    assert not far_slower.may_run_again([ran, crash], [])  # a candidate that crashed: not again
    assert far_slower.may_run_again([ran, crash], [], reference=True)
    assert not far_slower.may_run_again([crash], [], reference=True)  # never completed
    assert not far_slower.may_run_again([ran, crash, crash], [], reference=True)  # crashes again: done
