"""The knob base types: a knob's Candidate and Skip, the DeviceInfo and KnobContext it reads.

Their own module so that knobs.py and the knob helpers it calls (batch_size, zero) share
them without importing each other.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["COMPILE_COST_FACTOR", "COMPILE_STARTUP_S", "Candidate", "DeviceInfo", "KnobContext", "KnobFn", "Skip"]


COMPILE_COST_FACTOR = 3.0
"""A compile trial's expected wall time in baseline trials (its warm-up compiles)."""

COMPILE_STARTUP_S = 90.0
"""Seconds a compile trial may spend compiling before the far-slower cutoff counts: a cold
inductor compile of a small transformer took 25-60 s on a loaded 2-core CPU machine."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One setting of one knob: a label for the table and the overrides it applies."""

    knob: str
    label: str
    settings: dict[str, Any]
    cost_factor: float = 1.0
    """Expected trial time relative to the baseline's (bigger batches take longer per step)."""
    startup_s: float = 0.0
    """One-time seconds the setting adds before its first step (compilation). The far-slower
    cutoff allows for them: a trial is stopped for slow steps, not for compiling."""
    period_steps: int = 0
    """Steps between the runs of what the setting makes periodic (a log interval of 10: one
    read every 10 steps), 0 for none: a trial measures PERIODS_PER_TRIAL of them at least."""
    min_steps: int = 0
    """Measured steps a trial needs to hold the work the setting thins at all (the script's
    eval interval now): with fewer, both sides measure none of it, and the setting is skipped
    (admit.py) rather than read from noise."""


DEFAULT_WARMUP = 5
"""Warm-up steps of a script trial without --warmup-steps (the tune's command line)."""
MIN_EFFECT = 0.03
"""Smallest relative change a tune ever calls a speedup (TuneOptions.min_effect's default): a
what-if that thins calls taking less of the step than this cannot be told from the noise."""
PERIODS_PER_TRIAL = 3
"""Periods a trial measures at least. A trial of 10 steps held one of `--log-every 10`'s reads:
its steps bootstrapped as if independent, the read's step fell in 0-3 times per replicate, and
an H100's 1.58x (1.60x in the ablation) read as no measurable change."""


def steps_for_periods(offer: list[Candidate]) -> int:
    """The measured steps a trial needs for the longest period any offered setting makes."""
    return PERIODS_PER_TRIAL * max((c.period_steps for c in offer), default=0)


@dataclass(frozen=True, slots=True)
class Skip:
    """A setting (or a whole knob) not tried, and why."""

    knob: str
    label: str
    reason: str
    deferred: bool = False
    """True when the knob may apply later, on top of another knob's winner (the greedy step
    retries it), e.g. persistent_workers once num_workers > 0 won."""


@dataclass(kw_only=True)
class DeviceInfo:
    """What the trials will run on (decides which settings are possible)."""

    type: str = "cpu"
    """'cpu' or 'cuda'."""
    cores: int = 1
    """CPU cores available to this process."""
    cuda_capability: tuple[int, int] | None = None
    memory_bytes: float | None = None
    """GPU memory (cuda) or system RAM (cpu): the ceiling for the batch-size search."""
    cpu_flags: frozenset[str] = frozenset()
    has_compiler: bool = True
    """A C++ compiler for torch.compile's CPU backend (inductor)."""

    @classmethod
    def detect(cls, device: str = "auto") -> "DeviceInfo":
        import psutil
        import torch

        from trainspeed.device_spec import cuda_index
        from trainspeed.engine.precision import cpu_flags

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        index = cuda_index(device)
        use_cuda = index is not None

        info = cls(type="cuda" if use_cuda else "cpu", cores=cores,
                   cpu_flags=frozenset(cpu_flags() or ()),
                   has_compiler=any(shutil.which(c) for c in ("c++", "g++", "clang++", "cc")))
        if use_cuda:
            info.cuda_capability = torch.cuda.get_device_capability(index)
            info.memory_bytes = float(torch.cuda.get_device_properties(index).total_memory)
        else:
            info.memory_bytes = float(psutil.virtual_memory().total)
        return info


@dataclass(kw_only=True)
class KnobContext:
    """Everything a knob looks at: the config (as a nested dict) and the device."""

    config: dict[str, Any]
    device: DeviceInfo
    baseline_memory: float | None = None
    """Peak memory of the baseline trial (bytes), for the batch-size ceiling."""
    block_classes: list[str] = field(default_factory=list)
    """Repeated module classes of the model (candidates for activation checkpointing)."""

    def get(self, dotted: str) -> Any:
        node: Any = self.config
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node


KnobFn = Callable[[KnobContext], list]
