"""TensorBoard hparams: the run's config as flat hyperparameters and its final figures as metrics,
so runs (tune trials, A/B configs) can be compared in TensorBoard's HParams dashboard.

Pure functions; the TensorBoard sink writes them at close.
"""

from __future__ import annotations

import math
from typing import Any

METRIC_PREFIX = "hparam/"


def flatten_hparams(config: dict[str, Any], prefix: str = "") -> dict[str, bool | float | str]:
    """{"data": {"batch_size": 8}} -> {"data.batch_size": 8.0}. TensorBoard takes numbers, strings
    and booleans: lists and None become their text, non-finite numbers their text too."""
    out: dict[str, bool | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_hparams(value, prefix=f"{name}."))
        elif isinstance(value, bool) or isinstance(value, str):
            out[name] = value
        elif isinstance(value, (int, float)):
            out[name] = float(value) if math.isfinite(value) else str(value)
        else:
            out[name] = str(value)
    return out


class FinalMetrics:
    """Run figures from step records in constant memory: the last loss, mean step time and
    throughput over the non-warm-up steps (the same exclusion as the summary)."""

    def __init__(self) -> None:
        self.steps = 0
        self.loss: float | None = None
        self._time = 0.0
        self._timed = 0
        self._samples = 0.0
        self._tokens = 0.0

    def add(self, record: dict[str, Any]) -> None:
        self.steps += 1
        loss = record.get("loss")
        if isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss):
            self.loss = float(loss)
        t = record.get("t_step")
        if record.get("warmup") or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            return
        self._time += t
        self._timed += 1
        self._samples += float(record.get("samples") or 0)
        self._tokens += float(record.get("tokens") or 0)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {f"{METRIC_PREFIX}steps": float(self.steps)}
        if self.loss is not None:
            out[f"{METRIC_PREFIX}final_loss"] = self.loss
        if self._timed:
            out[f"{METRIC_PREFIX}step_ms"] = 1e3 * self._time / self._timed
            if self._samples:
                out[f"{METRIC_PREFIX}samples_per_s"] = self._samples / self._time
            if self._tokens:
                out[f"{METRIC_PREFIX}tokens_per_s"] = self._tokens / self._time
        return out
