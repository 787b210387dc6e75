"""WandbSink: the same scalars as TensorBoard, logged to Weights & Biases.

wandb is imported lazily (only when this sink is built). `mode="offline"` writes locally
and can be synced later with `wandb sync`. Network latency is absorbed by the AsyncWriter
thread, never by the training loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainspeed.errors import require
from trainspeed.sinks.tensorboard import finite_float, event_text, step_scalars
from trainspeed.telemetry import schema


class WandbSink:
    """Log step scalars with `step=` and events (numeric data + text in the run summary)."""

    name = "wandb"
    thinnable = True  # a dashboard: every k-th record when the writer is behind

    def __init__(
        self,
        project: str | None = None,
        run_name: str | None = None,
        config: dict[str, Any] | None = None,
        mode: str | None = None,
        dir: str | Path | None = None,  # noqa: A002 - mirrors wandb.init's argument name
    ) -> None:
        wandb = require("wandb", extra="wandb", feature="The W&B sink")
        kwargs: dict[str, Any] = {"project": project, "name": run_name, "mode": mode}
        if config is not None:
            kwargs["config"] = schema.sanitize_any(config)
        if dir is not None:
            Path(dir).mkdir(parents=True, exist_ok=True)
            kwargs["dir"] = str(dir)
        self._run: Any = wandb.init(**{k: v for k, v in kwargs.items() if v is not None})
        self._last_step = -1
        from trainspeed.sinks.hparams import FinalMetrics

        self._finals = FinalMetrics()  # final loss / step time / throughput for the run summary

    def write_steps(self, records: list[dict[str, Any]]) -> None:
        if self._run is None:
            return
        for record in records:
            self._finals.add(record)
            step = record.get("step")
            scalars = step_scalars(record)
            if not scalars:
                continue
            # W&B requires monotonically increasing steps; without one, let it count.
            if isinstance(step, int) and step > self._last_step:
                self._run.log(scalars, step=step)
                self._last_step = step
            else:
                self._run.log(scalars)

    def write_event(self, event: dict[str, Any]) -> None:
        if self._run is None:
            return
        kind = event.get("type", "event")
        data = event.get("data") or {}
        numeric = {
            f"events/{kind}/{k}": x
            for k, v in (data.items() if isinstance(data, dict) else ())
            if (x := finite_float(v)) is not None
        }
        if numeric:
            # commit=False: attach to the next step's row instead of creating a new step.
            self._run.log(numeric, commit=False)
        self._run.summary[f"events/{kind}"] = event_text(schema.sanitize_any(event))

    def flush(self) -> None:
        pass  # wandb streams in its own process; there is no per-call flush

    def close(self) -> None:
        if self._run is not None:
            from trainspeed.sinks.hparams import METRIC_PREFIX

            for key, value in self._finals.metrics().items():
                self._run.summary[f"final/{key.removeprefix(METRIC_PREFIX)}"] = value
            self._run.finish()
            self._run = None
