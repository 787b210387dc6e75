"""TensorBoardSink: scalars per step and events as text, under <run_dir>/tb; with `hparams=`
(the run's config), the HParams dashboard entry (flattened config + final figures) at close.

`step_scalars` (pure) decides which numbers a step record becomes; the W&B sink uses the
same function so both dashboards show the same tags.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trainspeed.errors import ConfigError, require
from trainspeed.telemetry import schema

_MIB = float(1 << 20)


def finite_float(value: Any) -> float | None:
    """A finite float, or None for missing/NaN/non-numeric values."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def step_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars a step record is plotted as (tag -> value); missing values are omitted.

    loss, lr, time/step_ms, time/<phase>_ms, throughput/samples_per_s and tokens_per_s
    (when the record has samples/tokens and a positive t_step), pad_share,
    memory/<name>_mib (bytes -> MiB; counters such as cuda_alloc_retries unscaled), host_syncs.
    """
    out: dict[str, float] = {}
    for key in ("loss", "lr", "pad_share"):
        x = finite_float(record.get(key))
        if x is not None:
            out[key] = x
    t_step = finite_float(record.get("t_step"))
    if t_step is not None:
        out["time/step_ms"] = t_step * 1e3
    phases = record.get("phases")
    if isinstance(phases, dict):
        for name, seconds in phases.items():
            x = finite_float(seconds)
            if x is not None:
                out[f"time/{name}_ms"] = x * 1e3
    if t_step is not None and t_step > 0:
        for key in ("samples", "tokens"):
            x = finite_float(record.get(key))
            if x is not None and x > 0:
                out[f"throughput/{key}_per_s"] = x / t_step
    mem = record.get("mem")
    if isinstance(mem, dict):
        for name, value in mem.items():
            x = finite_float(value)
            if x is None:
                continue
            if name.endswith("retries"):
                out[f"memory/{name}"] = x
            else:
                out[f"memory/{name}_mib"] = x / _MIB
    syncs = finite_float(record.get("syncs"))
    if syncs is not None:
        out["host_syncs"] = syncs
    return out


def event_text(event: dict[str, Any]) -> str:
    """One-line text of an event for dashboards: 'checkpoint @ step 100: path=..., seconds=...'."""
    data = event.get("data") or {}
    if isinstance(data, dict) and list(data) == ["message"]:  # notes and warnings: the sentence itself
        details = str(data["message"])
    else:
        details = ", ".join(f"{k}={v}" for k, v in data.items()) if isinstance(data, dict) else str(data)
    step = event.get("step")
    where = f" @ step {step}" if step is not None else ""
    return f"{event.get('type', 'event')}{where}: {details}" if details else f"{event.get('type')}{where}"


class TensorBoardSink:
    """Write step scalars (every `every`-th step) and events to a TensorBoard log directory."""

    name = "tensorboard"
    thinnable = True  # a dashboard: every k-th record when the writer is behind

    def __init__(self, log_dir: str | Path, *, every: int = 1, hparams: dict[str, Any] | None = None) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"TensorBoardSink every must be an int >= 1, got {every!r}")
        tb = require(
            "torch.utils.tensorboard",
            package="tensorboard",
            extra="tensorboard",
            feature="The TensorBoard sink",
        )
        self.log_dir = Path(log_dir)
        self.every = every
        self._writer = tb.SummaryWriter(log_dir=str(self.log_dir))
        self._count = 0  # fallback step counter for records without a "step"
        self._hparams = hparams
        self._finals: Any = None
        if hparams is not None:
            from trainspeed.sinks.hparams import FinalMetrics

            self._finals = FinalMetrics()

    def write_steps(self, records: list[dict[str, Any]]) -> None:
        if self._writer is None:
            return
        for record in records:
            if self._finals is not None:
                self._finals.add(record)
            step = record.get("step")
            if not isinstance(step, int):
                step = self._count
            self._count += 1
            if step % self.every:
                continue
            walltime = finite_float(record.get("t_wall"))
            for tag, value in step_scalars(record).items():
                self._writer.add_scalar(tag, value, global_step=step, walltime=walltime)

    def write_event(self, event: dict[str, Any]) -> None:
        if self._writer is None:
            return
        step = event.get("step")
        self._writer.add_text(
            f"events/{event.get('type', 'event')}",
            event_text(schema.sanitize_any(event)),
            global_step=step if isinstance(step, int) else None,
            walltime=finite_float(event.get("t_wall")),
        )

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            if self._hparams is not None:
                self._write_hparams()
            self._writer.close()
            self._writer = None

    def _write_hparams(self) -> None:
        """What SummaryWriter.add_hparams writes, but into this run's own log directory (one
        run = one HParams session) instead of a new timestamped subdirectory."""
        from torch.utils.tensorboard.summary import hparams

        from trainspeed.sinks.hparams import flatten_hparams

        metrics = self._finals.metrics()
        step = self._finals.steps
        exp, ssi, sei = hparams(flatten_hparams(self._hparams), metrics)
        file_writer = self._writer._get_file_writer()
        for summary in (exp, ssi, sei):
            file_writer.add_summary(summary, step)
        for tag, value in metrics.items():
            self._writer.add_scalar(tag, value, global_step=step)
