"""What a Monitor builds once at its start: the sink writer, the system sampler and the
profiler window. Setup only: nothing here runs per step (monitor.py keeps the hot path).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from trainspeed.errors import ConfigError
from trainspeed.telemetry import rundir

__all__ = ["is_cuda", "make_profile_window", "make_sampler", "make_writer"]


def is_cuda(device: Any) -> bool:
    if device is None:
        return False
    return str(device).startswith("cuda")


def make_writer(run_dir: Path | None, sinks: Sequence[Any], config: dict[str, Any] | None,
                total_steps: int | None):
    from trainspeed.sinks.factory import make_sinks
    from trainspeed.sinks.writer import AsyncWriter

    names = [s for s in sinks if isinstance(s, str)]
    objects = [s for s in sinks if not isinstance(s, str)]
    if run_dir is None:
        file_sinks = [n for n in names if n != "console"]
        if file_sinks:
            raise ConfigError(
                f"sinks {file_sinks} write files, but the Monitor has no run_dir. "
                "Pass Monitor(run_dir=...) or use sinks=('console',) / sinks=()."
            )
    # The config reaches the sinks too: W&B project/mode/run config, TensorBoard hparams.
    try:
        built = make_sinks(run_dir, names, total_steps=total_steps, config=config) if names else []
    except OSError as exc:  # the run directory cannot be written: the console still reports
        rundir.unwritable(run_dir, exc)
        built = make_sinks(run_dir, [n for n in names if n == "console"],
                           total_steps=total_steps, config=config)
    return AsyncWriter([*built, *objects])


def make_sampler(enabled: bool, device: Any, kind: str):
    if not enabled:
        return None
    from trainspeed.telemetry.sampler import SystemSampler

    gpu_index = None
    if is_cuda(device):
        import torch

        gpu_index = torch.device(device).index or 0
    # A doctor run is short (hundreds of steps, seconds to minutes): 4 rows a second line
    # other processes' load up with the steps it slowed (the ring holds 15 minutes of them).
    interval = 0.25 if kind == "doctor" else 1.0
    sampler = SystemSampler(interval_s=interval, gpu_index=gpu_index)
    sampler.start()
    return sampler


def make_profile_window(mon: Any, steps: Any):
    """A torch.profiler window over `steps` ('START-END') attached to `mon`; rank 0 only
    (ranks are alike)."""
    if steps is None or mon.rank != 0:
        return None
    if mon.run_dir is None:
        raise ConfigError("profile.steps needs a run directory for the trace; pass Monitor(run_dir=...)")
    from trainspeed.telemetry.profiling import ProfileWindow

    return ProfileWindow(mon.run_dir, steps, device=mon.device).attach(mon)
