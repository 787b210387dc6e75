"""`TuneOptions`: what a tune measures and how hard (knobs, budget, rounds, verdict thresholds,
how trials start). Validated on construction; the CLI leaves out what the user did not give,
so the defaults are documented here only."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainspeed.tune.knob_types import MIN_EFFECT
from trainspeed.tune.knobs import KNOBS


@dataclass(kw_only=True)
class TuneOptions:
    knobs: list[str] = field(default_factory=lambda: list(KNOBS))
    """Knobs to measure, in priority order (the budget cuts from the end)."""
    budget_s: float = 600.0
    """Wall-clock budget for all trials; knobs whose estimated cost does not fit are skipped."""
    repeats: int = 2
    """Interleaved repeats of every setting in the ablation (>= 2 measures run-to-run noise)."""
    baseline_every: int = 2
    """In each ablation round the baseline runs again after this many candidates, so each
    candidate has a baseline trial at most this many trials away on both sides (1: next to
    every candidate, twice the trials; larger: fewer trials, more drift between them)."""
    max_rounds: int = 12
    """Rounds a setting gets at most, the ablation's and those the rest of the budget buys
    (tune/spend.py: settings still undecided get more while a round fits). 1: each setting is
    measured in its ablation rounds only (`--repeats`), however much budget is left. Twelve,
    not six: pytorch/examples' vae read 1.27-1.31x in all 6 rounds of a worker setting, its 4
    rounds after being chosen needed 34 % to clear 3 standard errors of that tune's noise, and it
    stopped there with 550 s of its 600 s budget left."""
    verify_repeats: int = 3
    """Interleaved rounds of baseline and best config in the final verification, which decides
    best.yaml. Three, not two: the noise is the spread of the speedup between rounds, and two
    rounds give one spread, a noisy estimate of it (a VM read 1.05x and 1.17x in two rounds and
    refused a combination each step of which had been faster)."""
    loss_tolerance: float = 0.05
    """A setting whose parity loss is worse than the baseline's by more than this share fails."""
    min_effect: float = MIN_EFFECT
    """Smallest relative change ever called a speedup, whatever the measured noise."""
    fork_server: bool = True
    """Fork each trial from a process that imported torch and the engine once (Linux), instead
    of starting a new interpreter: ~4 s less per trial on a 2-core VM. Each trial is still its
    own process (tune/forkserver.py)."""

    def __post_init__(self) -> None:
        from trainspeed.errors import ConfigError

        if self.max_rounds < 1:
            raise ConfigError(f"tune: max_rounds must be >= 1, got {self.max_rounds}")
        if self.repeats < 1 or self.verify_repeats < 0 or self.baseline_every < 1:
            raise ConfigError(f"tune: repeats and baseline_every must be >= 1 and verify_repeats >= 0, "
                              f"got {self.repeats}, {self.baseline_every} and {self.verify_repeats}")
        if self.budget_s <= 0:
            raise ConfigError(f"tune: budget must be > 0 seconds, got {self.budget_s}")
        # `--min-effect -0.1` ran a whole tune: a negative floor calls a slowdown a speedup
        if not 0 <= self.min_effect < 1 or not 0 <= self.loss_tolerance:
            raise ConfigError(f"tune: --min-effect must be in [0, 1) (0.03: 3 %) and --loss-tolerance >= 0, "
                              f"got {self.min_effect} and {self.loss_tolerance}")
