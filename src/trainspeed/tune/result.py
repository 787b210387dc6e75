"""What a tune returns: the rows of its tables and the result that tune.json, the terminal
and HTML tables, and best.yaml are written from."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trainspeed.telemetry.throughput import COMPUTE_BOUND_MFU
from trainspeed.tune import stats


@dataclass(kw_only=True)
class Row:
    """One line of the ablation table (or of the greedy combination)."""

    knob: str
    setting: str
    settings: dict[str, Any] = field(default_factory=dict)
    verdict: str = stats.SKIPPED
    speedup: float | None = None
    ci: tuple[float, float] | None = None
    noise: float | None = None
    """The noise threshold: a change the CI does not clear by this much is no measurable change."""
    noise_from: str = ""
    """What set the threshold (stats.NOISE_*): shown as the reason of a 'no measurable change'."""
    memory_ratio: float | None = None
    """Candidate peak memory / reference peak memory."""
    loss_delta: float | None = None
    loss_deltas: dict[str, float | None] = field(default_factory=dict)
    """With several optimizers (a GAN's), each one's own loss delta (parity.judge_each);
    `loss_delta` is the failing one's, else the primary's. Empty with one optimizer."""
    note: str = ""
    cost_factor: float = 1.0
    one_time: tuple[float, int | None] | None = None
    """(extra warm-up seconds, steps to pay them back) when the setting costs time once
    (one_time.py): compilation."""
    stake: float | None = None
    """The share of the step time the doctor's finding put at stake for this knob (stakes.py)."""
    unverified: bool = False
    """The tune's answer as the ablation measured it: the budget left no fresh verification
    (verify.ablation_answer). Its table is titled so, not "Verified"."""

    @property
    def faster_inside_noise(self) -> bool:
        """No measurable change, yet its whole CI lies above 1: faster within its own trials,
        not beyond the run-to-run noise (the greedy's hopefuls; the closing line names them)."""
        return self.verdict == stats.NO_CHANGE and self.ci is not None and self.ci[0] > 1.0

    @property
    def ci_clears_band(self) -> bool:
        """Whether the CI lies wholly outside the noise band, as a faster/slower verdict reads it
        (stats.speed_verdict): a no-change row for which this holds was judged by another rule."""
        if self.ci is None or self.noise is None:
            return False
        low, high = stats.noise_band(self.noise)
        return self.ci[0] > high or self.ci[1] < low

    def as_dict(self) -> dict[str, Any]:
        return {"knob": self.knob, "setting": self.setting, "settings": self.settings,
                "verdict": self.verdict, "speedup": self.speedup,
                "ci": list(self.ci) if self.ci else None, "noise": self.noise,
                "noise_from": self.noise_from,
                "memory_ratio": self.memory_ratio, "loss_delta": self.loss_delta,
                **({"loss_deltas": self.loss_deltas} if self.loss_deltas else {}), "note": self.note,
                "one_time_s": self.one_time[0] if self.one_time else None,
                "pays_back_after_steps": self.one_time[1] if self.one_time else None,
                "at_stake": self.stake, **({"unverified": True} if self.unverified else {})}


@dataclass(kw_only=True)
class TuneResult:
    ablation: list[Row]
    combination: list[Row]
    """Greedy steps: each winner measured on top of the ones accepted before it."""
    best_settings: dict[str, Any]
    final: Row | None
    """The best config verified against the baseline."""
    baseline_cost_s: float
    trials_run: int
    trials_reused: int
    elapsed_s: float
    notes: list[str] = field(default_factory=list)
    baseline_mfu: float | None = None
    """The baseline trials' median MFU: how much of the device's peak is left to win."""
    peak_name: str | None = None
    others_load: float | None = None
    """Other processes' CPU (cores) during the median trial (load_note), None where unsampled."""

    def as_dict(self) -> dict[str, Any]:
        return {"schema": 1, "ablation": [r.as_dict() for r in self.ablation],
                "combination": [r.as_dict() for r in self.combination],
                "best_settings": self.best_settings,
                "final": self.final.as_dict() if self.final else None,
                "baseline_cost_s_per_sample": self.baseline_cost_s,
                "trials_run": self.trials_run, "trials_reused": self.trials_reused,
                "elapsed_s": self.elapsed_s, "notes": self.notes,
                "baseline_mfu": self.baseline_mfu, "peak_name": self.peak_name, "others_load": self.others_load}


def repeats_note(ran: int, planned: int, why: str) -> str:
    """A row's note on a comparison with fewer rounds than planned (search.Tuner.row)."""
    return f"{ran} of {planned} repeats ({why})"


_BUDGET_CUT = re.compile(r"\b\d+ of \d+ repeats \(budget\)")


def cut_by_budget(row: Row) -> bool:
    """Whether the row's comparison had fewer rounds than planned for the budget (repeats_note)."""
    return bool(_BUDGET_CUT.search(row.note or ""))


LOAD_NOTE_CORES = 0.5
"""Median CPU of other processes (cores) during a tune's trials from which its table says the
verdicts were taken on a busy machine."""


def median_load(loads: list[float]) -> float | None:
    """The median trial's load (the upper median, as load_note reads it)."""
    return sorted(loads)[len(loads) // 2] if loads else None


def threads_under_load_note(settings: dict[str, Any], load: float | None, cores: int) -> str | None:
    """Why a threads setting that won on a busy machine is the load's answer: fewer compute
    threads leave the cores others hold to them (a GAN example's threads=1 won beside a busy
    loop and went into best.patch). None when no threads setting won or the machine was quiet."""
    if "threads" not in settings or load is None or load < LOAD_NOTE_CORES:
        return None
    return (f"threads={settings['threads']}: measured while other processes used {load:.1f} of the machine's "
            f"{cores} cores; fewer compute threads win there by leaving those cores alone. On a machine of "
            "your own, measure it again before keeping it (`trainspeed tune --knobs threads` with a new --out)")


def load_note(loads: list[float], cores: int) -> str | None:
    """What the machine's load during the trials means for the verdicts (None: quiet enough).
    `loads`: each trial's median CPU of other processes, in cores (TrialResult.others_load)."""
    median = median_load(loads)
    if median is None or median < LOAD_NOTE_CORES:
        return None
    return (f"other processes used {median:.1f} of the machine's {cores} cores during the median trial "
            f"(up to {max(loads):.1f}): every setting was timed on a busy machine, so a verdict may be "
            "the load's, not the setting's. Rerun when the machine is quiet, or give the tune cores of "
            "its own (taskset -c), with a new --out (the same one reuses these trials)")


def utilization_note(mfu: float | None, peak_name: str | None, won: bool) -> str | None:
    """Why nothing won, when the baseline's MFU explains it: None when a setting won, or
    MFU is unknown, low, or invalid (over 100 %: a FLOP count or peak that is wrong)."""
    if won or mfu is None or not COMPUTE_BOUND_MFU <= mfu <= 1:
        return None
    share = f"the baseline runs at {100 * mfu:.0f} % of {peak_name or 'the device peak'}"
    return (f"no setting was measurably faster, and {share}: most of its step is the model's own "
            "arithmetic, which none of these switches removes. What is left lies outside them: "
            "lower precision where the device has units for it (bf16/fp16 on a GPU, AMX or "
            "avx512_bf16 on a CPU), or a device with more FLOP/s")
