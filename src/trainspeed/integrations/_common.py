"""What the Lightning and Hugging Face callbacks share: the phase switch over a Monitor, batch
counting without device syncs, the default run directory, and the end of a run (findings +
report), the same as `trainspeed train` ends one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from trainspeed.errors import ConfigError


class PhaseSwitch:
    """Exactly one framework phase open at a time: `to("backward")` ends the open phase and
    begins the next; `to(None)` leaves the time to "other". Framework hooks only tell us where
    one phase ends and the next begins, which is what this models."""

    __slots__ = ("mon", "current")

    def __init__(self, mon: Any) -> None:
        self.mon = mon
        self.current: str | None = None

    def to(self, name: str | None) -> None:
        if name == self.current:
            return
        if self.current is not None:
            self.mon.end(self.current)
        if name is not None:
            self.mon.begin(name)
        self.current = name


def first_tensor(batch: Any) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, dict) or hasattr(batch, "keys") and hasattr(batch, "values"):
        values = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        return None
    for value in values:
        found = first_tensor(value)
        if found is not None:
            return found
    return None


def count_batch(batch: Any) -> tuple[int, int, int]:
    """(samples, tokens, pad_tokens) of a batch, never reading device memory (no sync).

    samples: the first tensor's leading dimension. Tokens come from a mapping with
    `input_ids`: an `attention_mask` on the CPU splits real tokens from padding; on an
    accelerator reading the mask would be a sync, so every position counts as a token.
    """
    tensor = first_tensor(batch)
    samples = int(tensor.shape[0]) if tensor is not None and tensor.dim() else 0
    tokens = pad = 0
    get = getattr(batch, "get", None)
    ids = get("input_ids") if callable(get) else None
    if ids is not None and hasattr(ids, "numel"):
        tokens = int(ids.numel())
        mask = get("attention_mask")
        if mask is not None and hasattr(mask, "device") and mask.device.type == "cpu":
            real = int(mask.sum())
            tokens, pad = real, tokens - real
    return samples, tokens, pad


def call_counter(fn: Callable[[Any], Any] | None, batch: Any) -> tuple[int, int, int]:
    """The user's `batch_stats(batch)` -> samples or (samples, tokens[, pad]); default count_batch."""
    if fn is None:
        return count_batch(batch)
    out = fn(batch)
    if isinstance(out, int):
        return out, 0, 0
    if isinstance(out, (tuple, list)) and 1 <= len(out) <= 3:
        vals = [int(v) for v in out] + [0] * (3 - len(out))
        return vals[0], vals[1], vals[2]
    raise ConfigError(
        f"batch_stats must return samples or (samples, tokens[, pad_tokens]) as ints, got {out!r}"
    )


def default_run_dir(root: str | Path, framework: str) -> Path:
    """<root>/trainspeed/<framework>-<time>, never an existing directory."""
    from trainspeed.telemetry.rundir import fresh_run_dir

    return fresh_run_dir(Path(root) / "trainspeed" / f"{framework}-{time.strftime('%Y%m%d-%H%M%S')}")


def loss_value(outputs: Any) -> Any:
    """The loss from a training step's output (a tensor, or a mapping with "loss"), else None."""
    if outputs is None:
        return None
    if hasattr(outputs, "detach") and hasattr(outputs, "numel"):
        return outputs
    if isinstance(outputs, (int, float)):
        return outputs
    get = getattr(outputs, "get", None)
    value = get("loss") if callable(get) else None
    return value if value is None or isinstance(value, (int, float)) or hasattr(value, "detach") else None


def finish(mon: Any, *, error: BaseException | None = None, report: bool = True,
           html: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Close the Monitor, add the doctor's findings to report.json and (rank 0, when asked)
    render the report, as `trainspeed train` does at the end of a run."""
    summary = mon.close(error=error)
    findings: list[dict[str, Any]] = []
    if mon.run_dir is None or mon.rank != 0:
        return summary, findings
    from trainspeed.cli._finish import add_findings

    findings = add_findings(mon.run_dir)
    if report:
        try:
            from trainspeed.report import render_run

            render_run(mon.run_dir, html=html)
        except Exception as exc:  # noqa: BLE001 - the run directory is complete; rendering is a view
            print(f"trainspeed: report rendering failed ({type(exc).__name__}: {exc}); "
                  f"run `trainspeed report {mon.run_dir}`")
    return summary, findings
