"""The greedy combination and a winner coupled to another knob's setting (tune/coupled.py).

`make demo` (PNGs decoded in the DataLoader, 2 cores) measured num_workers=1 at 2.49x,
num_workers "1 + 1 compute threads" at 3.36x and threads=1 at 3.83x. The greedy step kept one
row per knob, num_workers' biggest, read its threads=1 as a clash with the bigger winner
threads=1 and skipped the knob: best.yaml held threads=1 alone, still data-bound."""

from __future__ import annotations

import pytest

from trainspeed.tune import stats
from trainspeed.tune.knob_types import Candidate
from trainspeed.tune.search import Tuner, TuneOptions
from trainspeed.tune.store import TrialStore

from tune_fakes import FakeRunner

pytestmark = pytest.mark.timeout(60)

W1, W2, T1, T2 = "loader.num_workers=1", "loader.num_workers=2", "threads=1", "threads=2"


class TableRunner(FakeRunner):
    """Step time factor per whole set of overrides (what the demo measured), 1.0 elsewhere."""

    def __init__(self, table, **kw):
        super().__init__(**kw)
        self.table = {frozenset(k): v for k, v in table.items()}

    def __call__(self, req):
        self.effects = {"*": 1.0}
        res = super().__call__(req)
        factor = self.table.get(frozenset(req.overrides), 1.0)
        res.step_times = [t * factor for t in res.step_times]
        return res


def _knobs(cores: int, workers: list[int]):
    def num_workers(ctx):
        out = [Candidate("num_workers", str(n), {"loader.num_workers": n}) for n in workers]
        if "threads" not in ctx:  # as script_knobs.num_workers: the cores split on a CPU
            out += [Candidate("num_workers", f"{n} + {cores - n} compute threads",
                              {"loader.num_workers": n, "threads": cores - n}) for n in workers if n < cores]
        return out

    def threads(ctx):
        return [Candidate("threads", str(n), {"threads": n}) for n in range(1, cores)]

    return {"num_workers": num_workers, "threads": threads}


def _tune(table, tmp_path, base_config, cpu, cores, workers):
    runner = TableRunner(table)
    t = Tuner(base_config=base_config, base_hash="h", device=cpu, runner=runner, store=TrialStore(tmp_path),
              options=TuneOptions(budget_s=10_000, knobs=["num_workers", "threads"]), say=lambda s: None,
              knob_table=_knobs(cores, workers), make_context=lambda settings, base: dict(settings))
    return runner, t.run()


def test_a_winner_whose_coupled_setting_equals_the_bigger_winners_is_tried_on_top(base_config, cpu, tmp_path):
    # the demo's figures: threads=1 3.8x, workers "1 + 1 compute threads" 3.4x, workers=1 2.5x.
    # On 2 cores "1 + 1 compute threads" on top of threads=1 is num_workers=1 on top of it: no
    # clash (the same threads value), so it is measured there, and judged by that comparison
    table = {(T1,): 1 / 3.8, (T1, W1): 1 / 3.4, (W1,): 1 / 2.5}
    _, result = _tune(table, tmp_path, base_config, cpu, cores=2, workers=[1])
    steps = [r for r in result.combination if r.knob == "num_workers"]
    assert len(steps) == 1 and steps[0].speedup is not None, [(r.setting, r.note) for r in steps]
    assert "already set" not in steps[0].note and steps[0].settings == {"threads": 1, "loader.num_workers": 1}
    assert steps[0].verdict == stats.SLOWER  # 3.4x under threads=1's 3.8x: threads=1 stays the answer
    assert result.best_settings == {"threads": 1}


def test_a_winner_that_conflicts_falls_back_to_its_knobs_next_winner_that_does_not(base_config, cpu, tmp_path):
    # 4 cores: threads=2 wins most (4x); num_workers' biggest, "1 + 3 compute threads" (3.5x),
    # sets threads=3, a real conflict; its next winner, num_workers=1 (2x), agrees with
    # threads=2 and is tried on top of it, where it doubles the speed again
    table = {(T2,): 1 / 4.0, ("threads=3", W1): 1 / 3.5, (W1,): 1 / 2.0, (T2, W1): 1 / 8.0}
    runner, result = _tune(table, tmp_path, base_config, cpu, cores=4, workers=[1, 2])
    assert result.best_settings == {"threads": 2, "loader.num_workers": 1}, [
        (r.knob, r.setting, r.verdict, r.note) for r in result.combination]
    notes = {r.setting: r.note for r in result.combination if r.knob == "num_workers"}
    assert "already set by a bigger winner" in notes["1 + 3 compute threads"]
    assert notes["1"] == "" and any(set(c.overrides) == {T2, W1} for c in runner.calls)
    assert result.final.verdict == stats.FASTER
