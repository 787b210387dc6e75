"""Where a trial's step time settles: its slow first steps are warm-up, whatever their count.

A trial leaves out a fixed number of warm-up steps, but the one-time costs do not keep to it:
torch.compile recompiles on a second shape, cudnn autotunes each new shape, loader workers
start on the first batch after the warm-up of a short trial. An image library's compile row
read 0.14x (CI 0.01-0.83) while its trial lines read 0.71x and 0.85x: a 39 s first step was
measured. The leading measured steps far slower than the trial's steady steps are moved to
the warm-up (their time is the setting's one-time cost, one_time.py), never more than half.
"""

from __future__ import annotations

import statistics
from typing import Sequence

SETTLE_RATIO = 2.0
"""A leading step slower than this many times the steady step time (the median of the
trial's second half) is still warming up. Step-to-step noise on a busy 2-core machine reaches
1.5x; compiling and autotuning steps are 10-1000x."""
SETTLE_MIN_S = 0.05
"""...and by this many seconds at least: steps of microseconds differ 2x by jitter alone (a
Linear(4, 1) step), while a compile or autotune step takes seconds."""


MIN_SETTLE_STEPS = 3
"""Fewest measured steps a trial is judged on: a trial cut to 1 warm-up + 3 measured steps
for the budget (trial_fit.py) is the common case with slow steps. chargpt's iteration-0
sample and checkpoint (59 s, in the step after the first) fell in such a trial's first measured
step beside 1.0-1.2 s steps, and stayed measured: the rule started at 4 steps."""


def settled_from(step_times: Sequence[float]) -> int:
    """The index of the first settled step: the leading steps slower than SETTLE_RATIO x the
    steady step time come before it (at most half of the steps, rounded down; 0 with fewer
    than MIN_SETTLE_STEPS)."""
    n = len(step_times)
    if n < MIN_SETTLE_STEPS:
        return 0
    steady = statistics.median(step_times[n // 2:])
    k = 0
    while k < n // 2 and step_times[k] > max(SETTLE_RATIO * steady, steady + SETTLE_MIN_S):
        k += 1
    return k


__all__ = ["MIN_SETTLE_STEPS", "SETTLE_MIN_S", "SETTLE_RATIO", "settled_from"]
