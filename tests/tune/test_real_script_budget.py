"""Regression from a real script (karpathy/minGPT chargpt, docs/real-scripts.md): each trial
took 37 s (start-up and the script's 500-token sample at iteration 0 included), so a 4m tune
skipped every setting with 'raise --budget', stopped after 42 s, and printed the same sentence
for 15 settings. The skip now names the budget that measures the setting and those above it, and that budget
does."""

from __future__ import annotations

import re
import types

import pytest

from trainspeed.tune import stats
from trainspeed.tune.search import Tuner, TuneOptions
from trainspeed.tune.store import TrialStore

from tune_fakes import FakeRunner

pytestmark = pytest.mark.timeout(30)

BF16 = "precision.mode=bf16-mixed"


def _tune(base_config, cpu, tmp_path, budget_s: float):
    runner = FakeRunner({BF16: 0.5}, wall_s=37.0)
    options = TuneOptions(budget_s=budget_s, knobs=["precision", "compile"])
    tuner = Tuner(base_config=base_config, base_hash="h", device=cpu, runner=runner,
                  store=TrialStore(tmp_path), options=options, say=lambda s: None)
    return {(r.knob, r.setting): r for r in tuner.run().ablation}


def test_a_setting_skipped_for_the_budget_names_the_budget_that_measures_it(base_config, cpu, tmp_path):
    rows = _tune(base_config, cpu, tmp_path / "a", 100)  # the baseline, and not one round more
    skipped = rows[("precision", "bf16-mixed")]
    assert skipped.verdict == stats.SKIPPED and skipped.speedup is None
    # a later setting needs more: the figure counts the settings above it too
    later = re.search(r"--budget (\d+)m", rows[("compile", "default")].note)
    assert later and int(later.group(1)) > int(re.search(r"--budget (\d+)m", skipped.note).group(1))
    fits = re.search(r"--budget (\d+)m measures it and the settings above it", skipped.note)
    assert fits, skipped.note
    # as the note says: that budget measures it
    rows = _tune(base_config, cpu, tmp_path / "b", 60 * int(fits.group(1)))
    assert rows[("precision", "bf16-mixed")].verdict == stats.FASTER
    compile_budget = int(later.group(1))
    rows = _tune(base_config, cpu, tmp_path / "c", 60 * compile_budget)
    assert rows[("compile", "default")].speedup is not None, rows[("compile", "default")].note


def test_unmeasured_settings_are_listed_once_per_reason():
    from trainspeed.cli.tune import no_winner_line

    def row(knob, setting, note):
        return types.SimpleNamespace(knob=knob, setting=setting, note=note, verdict="skipped", speedup=None)

    above = "measures it and the settings above it)"
    line = no_winner_line(types.SimpleNamespace(ablation=[
        row("num_workers", "0", f"does not fit the budget (~145 s for 2 repeats; --budget 7m {above}"),
        row("num_workers", "1", f"does not fit the budget (~145 s for 2 repeats; --budget 7m {above}"),
        row("compile", "default", f"does not fit the budget (~291 s for 2 repeats; --budget 10m {above}"),
        row("tf32", "on", "TF32 needs an NVIDIA GPU of compute capability 8.0+")]))
    assert line.count("does not fit the budget") == 1 and line.count("TF32 needs") == 1
    assert "num_workers=0, num_workers=1, compile=default: does not fit the budget (~145 s for 2 repeats; " \
           "--budget 7m measures it and the settings above it)" in line


def test_baseline_repeats_are_never_stopped_as_far_slower(base_config, cpu, tmp_path):
    # word_language_model on a machine whose load rose mid-tune: a baseline repeat was stopped
    # at 30 s as "far slower" than the first baseline trial, a verdict on the load
    runner = FakeRunner({BF16: 0.5}, wall_s=5.0)
    options = TuneOptions(budget_s=10_000, knobs=["precision"])
    Tuner(base_config=base_config, base_hash="h", device=cpu, runner=runner, store=TrialStore(tmp_path),
          options=options, say=lambda s: None).run()
    baselines = [c for c in runner.calls if not c.overrides]
    others = [c for c in runner.calls if c.overrides]
    assert len(baselines) >= 2 and all(c.timeout_s is None for c in baselines)
    assert others and all(c.timeout_s is not None for c in others)


def test_loss_parity_compares_trials_of_one_length(base_config, cpu, tmp_path):
    # word_language_model's tune: the first baseline (the script tuner's pricing run) stopped
    # after 30 steps at loss 7.126; every later trial ran the epoch's 124 steps (baseline 6.585,
    # bf16 6.576); the table read bf16's loss delta as -2.1 % instead of -0.14 %
    fake = FakeRunner({BF16: 0.5}, wall_s=1.0)

    def runner(request):
        result = fake(request)
        first = not request.overrides and request.repeat == 0
        result.steps_run = 30 if first else 124
        result.loss = 7.126 if first else (6.576 if request.overrides else 6.585)
        return result

    options = TuneOptions(budget_s=10_000, knobs=["precision"])
    result = Tuner(base_config=base_config, base_hash="h", device=cpu, runner=runner, store=TrialStore(tmp_path),
                   options=options, say=lambda s: None).run()
    row = next(r for r in result.ablation if r.setting == "bf16-mixed")
    assert row.loss_delta == pytest.approx(6.576 / 6.585 - 1, abs=1e-6)


def test_the_budget_ran_out_note_only_where_a_setting_went_unmeasured_for_it(base_config, cpu, tmp_path):
    """HelloDeepSpeed's zero_stage tune (its DeepSpeed config is a dict in the code): a 127 s
    baseline used the budget, every setting was skipped for its own reason, and the closing note
    said the budget ran out and to rerun with a larger one."""
    def tune(knobs, out):
        options = TuneOptions(budget_s=240, knobs=knobs)
        return Tuner(base_config=base_config, base_hash="h", device=cpu, runner=FakeRunner({BF16: 0.5}, wall_s=130.0),
                     store=TrialStore(out), options=options, say=lambda s: None).run()

    not_ds = tune(["zero_stage"], tmp_path / "z")
    assert not_ds.ablation and all(r.verdict == stats.SKIPPED and "budget" not in r.note for r in not_ds.ablation)
    assert not any("ran out" in n for n in not_ds.notes), not_ds.notes
    bf16 = tune(["precision"], tmp_path / "p")
    assert any(r.verdict == stats.SKIPPED and "budget" in r.note for r in bf16.ablation)
    assert any("ran out" in n for n in bf16.notes), bf16.notes
