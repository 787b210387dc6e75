"""A tune's result once its trials are done: the answer with the notes that qualify it (a
combination verified as no faster, one-time costs, the budget, the machine's load, MFU)."""

from __future__ import annotations

import statistics
from typing import Any

from trainspeed.tune import stats
from trainspeed.tune.arms import arm_of
from trainspeed.tune.budget_plan import budget_note
from trainspeed.tune.one_time import kept_one_time_notes
from trainspeed.tune.parity import unmoved_loss_note
from trainspeed.tune.result import Row, TuneResult, load_note, median_load, utilization_note
from trainspeed.tune.spend import early_end_note


def tune_result(tuner: Any, ablation: list[Row], combination: list[Row], final: Row | None,
                best: dict[str, Any], leftover: str | None = None) -> TuneResult:
    """The Tuner's TuneResult: best.yaml's settings are the baseline's where the verification
    did not read them faster. `leftover`: leftover.measure_left's note on a skipped setting whose
    round the budget left could not pay."""
    notes: list[str] = []
    if final is not None and final.verdict != stats.FASTER:
        notes.append(f"the combination verified as '{final.verdict}' against the baseline; "
                     "best.yaml keeps the baseline settings")
        best = {}
    notes += kept_one_time_notes(ablation, best)
    note = budget_note(tuner._over_budget(), [*ablation, *combination], tuner.opt.budget_s)
    if note:
        notes.append(note)
    note = early_end_note(tuner)
    if note:
        notes.append(note)
    if leftover:
        notes.append(leftover)
    base_trials = [r for r in tuner.results({}) if r.ok]
    note = unmoved_loss_note(base_trials)
    if note:
        notes.append(note)
    mfus = [r.mfu for r in base_trials if r.mfu is not None]
    base_mfu = statistics.median(mfus) if mfus else None
    peak_name = next((r.peak_name for r in base_trials if r.peak_name), None)
    note = utilization_note(base_mfu, peak_name, won=bool(best))
    if note:
        notes.append(note)
    ran = [r for key, repeat in tuner.ran if (r := tuner.store.get(key, repeat)) is not None and r.ok]
    loads = [r.others_load for r in ran if r.others_load is not None]
    note = load_note(loads, tuner.device.cores)
    if note:
        notes.append(note)
    return TuneResult(ablation=ablation, combination=combination, best_settings=best,
                      final=final, baseline_cost_s=stats.arm_cost(arm_of(base_trials)),
                      trials_run=tuner.run_count, trials_reused=tuner.reused,
                      elapsed_s=tuner.clock() - tuner.t0, notes=notes,
                      baseline_mfu=base_mfu, peak_name=peak_name, others_load=median_load(loads))
