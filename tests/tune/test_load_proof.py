"""Load-proof winners (load_proof.py): injected load readings, no real machine load."""

from __future__ import annotations

import pytest

from trainspeed.tune import stats
from trainspeed.tune.load_proof import loads_match
from trainspeed.tune.search import Tuner, TuneOptions
from trainspeed.tune.store import TrialStore

from tune_fakes import FakeRunner

FUSED = "optim.implementation=fused"
BF16 = "precision.mode=bf16-mixed"


class Neighbour(FakeRunner):
    """A busy loop on one of the two cores from trial `start` on (mid-tune), present while
    `busy(request)` says so: the trial runs 2x slower and its sampler reads 1.0 core of others."""

    def __init__(self, effects, *, start, busy, **kw):
        super().__init__(effects, **kw)
        self.start, self.busy = start, busy

    def __call__(self, req):
        res = super().__call__(req)
        on = len(self.calls) > self.start and self.busy(req)
        res.others_load = 1.0 if on else 0.05
        if on:
            res.step_times = [2 * t for t in res.step_times]
        return res


def run(base_config, cpu, runner, tmp_path, knobs):
    options = TuneOptions(budget_s=10_000, knobs=knobs)
    return Tuner(base_config=base_config, base_hash="h", device=cpu, runner=runner, store=TrialStore(tmp_path),
                 options=options, say=lambda s: None).run()


def row_of(result, setting):
    return next(r for r in result.ablation if r.setting == setting)


def on_reference(req):
    return not req.overrides  # its bursts land on the baseline trials


def test_a_neighbour_that_starts_mid_tune_does_not_produce_a_winner(base_config, cpu, tmp_path):
    # fused changes nothing; from the second trial on, the neighbour's bursts land on the
    # baseline trials: before, fused read ~2x "faster", and was verified so, into best.yaml
    runner = Neighbour({}, start=1, busy=on_reference)
    result = run(base_config, cpu, runner, tmp_path, ["fused_optimizer"])
    fused = row_of(result, "fused")
    assert fused.verdict == stats.BUSY, (fused.verdict, fused.speedup, fused.note)
    assert fused.speedup > 1.5  # what it read (a quiet first baseline in one bracket), shown beside the verdict
    assert "load differed" in fused.note
    assert result.best_settings == {} and result.final is None
    # its mismatched rounds were run again, with fresh repeats of both
    repeats = [c.repeat for c in runner.calls if c.overrides == (FUSED,)]
    assert len(repeats) == len(set(repeats)) > TuneOptions().repeats


def test_a_winner_whose_repeats_see_matched_load_is_judged_on_them(base_config, cpu, tmp_path):
    # the bursts stop after the ablation's first round: the repeated rounds are quiet on both
    # sides, and fused reads what it is, no change; bf16's real 2x still wins
    runner = Neighbour({BF16: 0.5}, start=1, busy=lambda req: on_reference(req) and len(runner.calls) <= 4)
    result = run(base_config, cpu, runner, tmp_path, ["fused_optimizer", "precision"])
    assert row_of(result, "fused").verdict == stats.NO_CHANGE
    bf16 = row_of(result, "bf16-mixed")
    assert bf16.verdict == stats.FASTER and bf16.speedup == pytest.approx(2.0, rel=0.1)
    assert result.best_settings == {"precision.mode": "bf16-mixed"}


def test_a_steady_neighbour_on_both_sides_leaves_a_real_winner_alone(base_config, cpu, tmp_path):
    runner = Neighbour({BF16: 0.5}, start=0, busy=lambda req: True)
    result = run(base_config, cpu, runner, tmp_path, ["precision"])
    assert row_of(result, "bf16-mixed").verdict == stats.FASTER
    assert result.final.verdict == stats.FASTER and "load" not in result.final.note


def test_the_verification_must_hold_with_the_load_matched(base_config, cpu, tmp_path):
    # quiet through the ablation; from the verification on, the neighbour sits on the baseline trials
    runner = Neighbour({BF16: 0.8}, start=10, busy=on_reference)
    result = run(base_config, cpu, runner, tmp_path, ["precision"])
    assert row_of(result, "bf16-mixed").verdict == stats.FASTER
    assert result.final.verdict == stats.BUSY
    assert result.best_settings == {}


def test_a_neighbour_that_outlasts_the_first_repeat_does_not_refuse_a_real_winner(base_config, cpu, tmp_path):
    # bf16's real 2x; the neighbour sits on the baseline's first six trials: the ablation's
    # rounds and their first repeat all differ in load. Repeated until the load matches (the
    # budget pays), bf16 wins on matched rounds; one repeat alone read "busy" and kept nothing.
    runner = Neighbour({BF16: 0.5}, start=0, busy=lambda req: on_reference(req) and req.repeat < 6)
    result = run(base_config, cpu, runner, tmp_path, ["precision"])
    bf16 = row_of(result, "bf16-mixed")
    assert bf16.verdict == stats.FASTER, (bf16.verdict, bf16.note)
    assert bf16.speedup == pytest.approx(2.0, rel=0.1) and "rounds whose loads matched" in bf16.note
    assert result.best_settings == {"precision.mode": "bf16-mixed"}


def test_a_neighbour_that_never_leaves_is_repeated_a_bounded_number_of_times(base_config, cpu, tmp_path):
    from trainspeed.tune.load_proof import LOAD_RETRIES

    runner = Neighbour({}, start=1, busy=on_reference)
    result = run(base_config, cpu, runner, tmp_path, ["fused_optimizer"])
    fused = row_of(result, "fused")
    assert fused.verdict == stats.BUSY and f"after {LOAD_RETRIES} repeat(s)" in fused.note, fused.note
    ablation = TuneOptions().repeats
    repeats = [c.repeat for c in runner.calls if c.overrides == (FUSED,)]
    assert len(repeats) <= ablation + LOAD_RETRIES * ablation


def test_loads_match_on_the_cores_left_free():
    assert loads_match([0.05, 0.1], 0.2, cores=2)
    assert not loads_match([1.0], 0.05, cores=2)  # a busy loop on one of two cores
    assert loads_match([1.0], 0.05, cores=16)  # one of sixteen
    assert loads_match([None], 1.5, cores=2) and loads_match([0.1], None, cores=2)  # not sampled
    assert loads_match([2.5], 3.0, cores=2)  # saturated either way
    # a bracket of one loaded baseline and one quiet one: their mean (0.37) matched a quiet
    # candidate; each must (karpathy/makemore's foreach read 1.87x from such a bracket)
    assert not loads_match([0.73, 0.0], 0.04, cores=2)
    assert loads_match([0.0, 0.05], 0.04, cores=2)


def test_the_closing_line_says_the_machine_was_busy_not_that_nothing_won(base_config, cpu, tmp_path):
    from trainspeed.cli.tune import no_winner_line

    result = run(base_config, cpu, Neighbour({}, start=1, busy=on_reference), tmp_path, ["fused_optimizer"])
    line = no_winner_line(result)
    assert line.startswith("nothing is kept: fused_optimizer=fused (") and "not measurable while the machine is busy" in line


def test_rounds_that_compared_a_loaded_trial_with_a_quiet_one_leave_the_noise_pool(base_config, cpu, tmp_path):
    runner = Neighbour({}, start=1, busy=on_reference)
    tuner = Tuner(base_config=base_config, base_hash="h", device=cpu, runner=runner, store=TrialStore(tmp_path),
                  options=TuneOptions(budget_s=10_000, knobs=["fused_optimizer"]), say=lambda s: None)
    tuner.run()
    fused = tuner._key({"optim.implementation": "fused"})
    first = (0, 1)  # the ablation's repeats of fused
    assert not [k for k in tuner.round_logs if k[3] == fused and k[4] == first]


def test_a_loser_whose_trials_ran_under_a_neighbour_leaves_the_noise_pool_too(base_config, cpu, tmp_path):
    # the neighbour sits on fused's trials only: it reads slower (no load check for a loser),
    # and its rounds measured the neighbour, not the machine's noise, which the other rows are
    # judged by (makemore beside a 75 s neighbour: the pool read 32-62 %, and every row no change)
    runner = Neighbour({}, start=0, busy=lambda req: req.overrides == (FUSED,))
    tuner = Tuner(base_config=base_config, base_hash="h", device=cpu, runner=runner, store=TrialStore(tmp_path),
                  options=TuneOptions(budget_s=10_000, knobs=["fused_optimizer"]), say=lambda s: None)
    result = tuner.run()
    assert row_of(result, "fused").verdict == stats.SLOWER
    fused = tuner._key({"optim.implementation": "fused"})
    assert not [k for k in tuner.round_logs if k[3] == fused]
    foreach = tuner._key({"optim.implementation": "foreach"})
    assert [k for k in tuner.round_logs if k[3] == foreach]  # a quiet comparison still counts


def test_a_setting_dropped_for_the_budget_is_not_repeated_for_its_load(base_config, cpu, tmp_path):
    """makemore on the loaded 2-core machine: num_workers=1 was dropped after round 1 ('the
    budget left fits another round of the 1 fastest only'), read faster on loads that differed,
    and the load check 'repeated' it: a 41 s baseline trial ran beside no candidate (a dropped
    setting is not run again), out of a 600 s budget."""
    runner = Neighbour({BF16: 0.5}, start=0, busy=on_reference)
    options = TuneOptions(budget_s=10_000, knobs=["precision"])
    tuner = Tuner(base_config=base_config, base_hash="h", device=cpu, runner=runner, store=TrialStore(tmp_path),
                  options=options, say=lambda s: None)
    bf16 = {"precision.mode": "bf16-mixed"}
    for settings, label, repeat in [({}, "baseline", 0), (bf16, "bf16", 0), ({}, "baseline", 1),
                                    (bf16, "bf16", 1), ({}, "baseline", 2)]:
        tuner.trial(settings, label, repeat)
    tuner.dropped.add(tuner.key(bf16))
    ran = len(runner.calls)
    row = tuner.row("precision", "bf16-mixed", bf16, {}, pairs=[((0, 1), 0), ((1, 2), 1)])
    assert len(runner.calls) == ran, [(c.overrides, c.repeat) for c in runner.calls[ran:]]
    assert row.verdict == stats.BUSY and "not repeated (dropped for the budget)" in row.note, row.note


class Drift(FakeRunner):
    """Baseline trials after the first run 1.6x slower, with no other process to read (the
    machine's own drift, unseen by the load check): a candidate's bracket of baselines then
    spans a quiet and a slow trial."""

    def __call__(self, req):
        res = super().__call__(req)
        if on_reference(req) and req.repeat > 0:
            res.step_times = [1.6 * t for t in res.step_times]
        res.others_load = 0.0
        return res


def test_a_bracket_whose_baselines_disagree_sets_the_noise_of_a_one_round_comparison(base_config, cpu, tmp_path):
    # one round, fused changes nothing: its bracket reads (1 + 1.6) / 2 = 1.3x against it.
    # At the 3 % floor it was "faster"; what its two baselines disagree by is its noise. (One
    # round: with more, every later baseline here is 1.6x slower than every candidate trial,
    # which no tune can tell from a 1.6x win.)
    options = TuneOptions(budget_s=10_000, knobs=["fused_optimizer"], repeats=1, max_rounds=1)
    result = Tuner(base_config=base_config, base_hash="h", device=cpu, runner=Drift({}), store=TrialStore(tmp_path),
                   options=options, say=lambda s: None).run()
    fused = row_of(result, "fused")
    assert fused.speedup > 1.1 and fused.verdict == stats.NO_CHANGE, (fused.speedup, fused.verdict, fused.noise)
    assert fused.noise_from == stats.NOISE_BRACKET and fused.noise == pytest.approx(0.6, abs=0.05)
    assert result.best_settings == {}


def test_bracket_spread_is_the_median_of_the_rounds_disagreements():
    assert stats.bracket_spread([[1.0, 1.5], [1.0, 1.1], [2.0, 2.0]]) == pytest.approx(0.1)
    assert stats.bracket_spread([[1.0], [2.0]]) == 0.0  # one reference trial a round: nothing to read
    assert stats.bracket_spread([]) == 0.0


class FreedCores(FakeRunner):
    """A neighbour with work enough for every core: a setting that uses fewer cores (threads=1)
    leaves it one, so its trials read 1.0 core of others against the baseline's 0.3, whatever
    the machine does."""

    def __call__(self, req):
        res = super().__call__(req)
        res.others_load = 1.0 if req.overrides else 0.3
        return res


def test_a_winner_that_left_cores_to_the_neighbours_is_not_refused_for_their_load(base_config, cpu, tmp_path):
    # super_resolution's threads=1, verified at 1.62x, and mnist_rnn's num_workers=1 (5.42x)
    # read "not measurable while the machine is busy": the load they differed by was the one
    # the setting handed over; a burst on the references (the test above) is still refused
    runner = FreedCores({BF16: 0.6})
    result = run(base_config, cpu, runner, tmp_path, ["precision"])
    bf16 = row_of(result, "bf16-mixed")
    assert bf16.verdict == stats.FASTER, (bf16.verdict, bf16.note)
    assert result.best_settings == {"precision.mode": "bf16-mixed"} and result.final.verdict == stats.FASTER


def test_a_win_stands_on_load_against_the_candidate_never_for_it():
    from trainspeed.tune.load_proof import load_fair_to_win

    assert load_fair_to_win([0.3, 0.3], 1.0, 2)  # the candidate had less free: the load was against it
    assert not load_fair_to_win([1.0, 0.3], 0.3, 2)  # a burst on one reference: a win may be the load's
    assert load_fair_to_win([0.3], 0.35, 2) and load_fair_to_win([None], 1.9, 2)
