"""What a tune returns: the rows of its tables and the result that tune.json, the terminal
and HTML tables, and best.yaml are written from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    memory_ratio: float | None = None
    """Candidate peak memory / reference peak memory."""
    loss_delta: float | None = None
    note: str = ""
    cost_factor: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"knob": self.knob, "setting": self.setting, "settings": self.settings,
                "verdict": self.verdict, "speedup": self.speedup,
                "ci": list(self.ci) if self.ci else None, "noise": self.noise,
                "memory_ratio": self.memory_ratio, "loss_delta": self.loss_delta, "note": self.note}


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

    def as_dict(self) -> dict[str, Any]:
        return {"schema": 1, "ablation": [r.as_dict() for r in self.ablation],
                "combination": [r.as_dict() for r in self.combination],
                "best_settings": self.best_settings,
                "final": self.final.as_dict() if self.final else None,
                "baseline_cost_s_per_sample": self.baseline_cost_s,
                "trials_run": self.trials_run, "trials_reused": self.trials_reused,
                "elapsed_s": self.elapsed_s, "notes": self.notes}
