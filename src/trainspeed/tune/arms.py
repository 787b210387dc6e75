"""Trials pooled into what the statistics compare: an Arm of step times and samples per repeat
(a bracket's baseline trials pooled as one repeat), the mean loss and the peak memory over
trials. Pure functions of TrialResult lists, used by the search."""

from __future__ import annotations

import math
from typing import Any

from trainspeed.tune import stats
from trainspeed.tune.trials import TrialResult

__all__ = ["arm_of", "fill_samples", "fmt_loss", "fmt_losses", "max_memory", "mean_loss"]


def arm_of(groups: list[TrialResult] | list[list[TrialResult]]) -> stats.Arm:
    """An arm with one repeat per trial, or per group of trials pooled (a bracket's baselines)."""
    pooled = [g if isinstance(g, list) else [g] for g in groups]
    flat = [r for g in pooled for r in g]
    per_epoch = next((r.steps_per_epoch for r in flat if r.steps_per_epoch), None)

    def cat(field: str) -> list[list[Any]]:
        return [[x for r in g for x in getattr(r, field)] for g in pooled]

    # A trial without epoch starts stores none: pad its mask so a pooled group stays aligned.
    starts = [[x for r in g for x in (r.epoch_starts or [False] * len(r.step_times))] for g in pooled]
    return stats.Arm.of(cat("step_times"), cat("samples"), starts, per_epoch)


def mean_loss(results: list[TrialResult]) -> float | None:
    losses = [r.loss for r in results if r.ok and r.loss is not None]
    if not losses:
        return None
    if any(not math.isfinite(x) for x in losses):
        return math.inf
    return sum(losses) / len(losses)


def max_memory(results: list[TrialResult]) -> float | None:
    mems = [r.memory_peak for r in results if r.memory_peak]
    return max(mems) if mems else None


def fmt_loss(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def fmt_losses(result: TrialResult) -> str:
    """A trial's loss as its progress line shows it: `2.258`, or with several optimizers each
    one's own, the primary's first (`0.6931 (optimizerD), optimizerG 1.204`)."""
    others = {k: v for k, v in result.optimizer_losses.items() if k != result.loss_optimizer}
    if not others:
        return fmt_loss(result.loss)
    primary = f" ({result.loss_optimizer})" if result.loss_optimizer else ""
    return f"{fmt_loss(result.loss)}{primary}, " + ", ".join(f"{k} {fmt_loss(v)}" for k, v in others.items())


BATCH_WORDS = ("batch", "accum", "micro")
"""A setting whose key holds one of these may change the samples per step."""


def fill_samples(result: TrialResult, settings: dict[str, Any], baseline: list[TrialResult]) -> TrialResult:
    """A trial that counted no samples (all 0), of a setting that keeps the batch, gets the
    baseline's samples per step: its cost is then the per-step time, as it is. The doctor counts
    a script's samples in the model's forward hooks, which see no forward called past the module
    (`model.forward(x)`); before compiled_calls.py, none inside a model compiled in place either:
    word_language_model's compile trials read 'nan ms/sample' and their row 'no measurable
    change' at a NaN speedup, counted as measured."""
    if not result.ok or not result.samples or any(x > 0 for x in result.samples) or not settings:
        return result
    if any(word in str(k).lower() for k in settings for word in BATCH_WORDS):
        return result
    known = sorted(x for r in baseline if r.ok for x in r.samples if x > 0)
    if known:
        result.samples = [known[len(known) // 2]] * len(result.step_times)
    return result
