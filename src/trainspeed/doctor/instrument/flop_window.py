"""The FLOPs of one real step of the script, for MFU: FlopCounterMode is entered at one step
boundary and left at the next, instead of re-running the user's model (which we cannot do
safely). The counted step runs slower, so it is marked as warm-up.

A compiled model runs that one step eagerly under the counter (TorchDynamo runs the frames as
written while a dispatch mode is active, and does not recompile: torch 2.13, a compiled MLP
counted exactly its eager FLOPs, its graph count unchanged). llama2.c with --compile=True read
"MFU not measured" where its eager run read 18.9 %. An eager step can need more memory than the
compiled one (no fusion), so on a GPU it is counted only with room to spare."""

from __future__ import annotations

import time
from typing import Any

EAGER_STEP_ROOM = 0.5
"""A compiled model's step is counted eagerly on a GPU only while the run's peak allocation is
below half the device's memory: an unfused step holds more activations than the compiled one."""


NO_ROOM = ("the model is compiled and one eager step to count its FLOPs might not fit in the memory left; "
           "the doctor counted none")
"""Why a compiled model's MFU is not measured (the report's MFU line)."""


def room_for_an_eager_step() -> bool:
    """Can one eager step of a compiled model run beside this run's memory? On the CPU: while the
    machine has as much memory free as the process holds. A model whose eager form is far larger
    than its compiled one (FlexAttention at long sequences) can still need more: `trainspeed
    doctor --no-flops` counts nothing."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        try:
            import psutil

            return psutil.virtual_memory().available >= psutil.Process().memory_info().rss
        except Exception:  # noqa: BLE001 - no reading: do not risk the run
            return False
    try:
        device = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(device).total_memory
        return torch.cuda.max_memory_allocated(device) < EAGER_STEP_ROOM * total
    except Exception:  # noqa: BLE001 - no reading: do not risk the run
        return False


COUNT_COST_STEPS = 3.0
"""What a counted step may cost, in ordinary steps, as a run with a time limit judges it: the
counter dispatches every op through Python, ~1.2x on a transformer's large matmuls and 5.7x on
time_sequence_prediction's LSTMCell loop (a 216 s step beside 38 s ones)."""

TOO_SLOW = ("this run had a time limit (a tune's first trial) and its steps were too slow to count one "
            "within it; the doctor counted none")
"""Why a time-limited run's MFU is not measured."""


def affordable(elapsed_s: float, last_step_s: float, limit_s: float) -> bool:
    """Whether a counted step (COUNT_COST_STEPS of the last step's length) still ends within a
    time limit `limit_s` seconds from the run's start, `elapsed_s` seconds in. Counting in the
    first step after the start, the "last step" is the whole time since the start (the script's
    own start-up included): a cautious guess, where a skipped count costs only the trial's MFU
    figure. The tune's first trial stops once 10-60 s old: it only has to find the step time,
    and counting time_sequence_prediction's 35 s steps took 178 s more, a third of a 10-minute
    tune, that also priced every later trial's warm-up at 338 s instead of ~155 s."""
    return elapsed_s + COUNT_COST_STEPS * last_step_s <= limit_s


class FlopWindow:
    def __init__(self, count_at: int | None) -> None:
        self.count_at = count_at
        """The step after which counting starts (None: never, or given up)."""
        self._counter: Any = None
        self._last_boundary: float | None = None
        """perf_counter time of the step boundary before this one (a time-limited run's last step)."""

    @property
    def counting(self) -> bool:
        return self._counter is not None

    def after_step(self, session: Any) -> None:
        """Called at every step boundary: open the window at `count_at`, close it one step later."""
        at = self.count_at
        if at is None:
            return
        done = session.mon.steps_done
        limit = session.time_limit
        if limit is not None and done < at:
            self._last_boundary = time.perf_counter()
        if done == at and self._counter is None:
            if limit is not None:
                now = time.perf_counter()
                last_step = now - (self._last_boundary if self._last_boundary is not None else session.t_start)
                if not affordable(now - session.t_start, last_step, limit[0]):
                    self._skip(session, TOO_SLOW)
                    return
            if session.observations.get("compiled") and not room_for_an_eager_step():
                self._skip(session, NO_ROOM)  # its eager step could run out of memory: the report says why
                return
            try:
                from trainspeed.telemetry.flops import flop_counter

                counter = flop_counter()  # counts CPU attention too (see missing_formulas)
                counter.__enter__()
                self._counter = counter
                session.mon.mark_warmup()  # the step now open is the counted (slower) one
            except Exception:  # noqa: BLE001 - MFU is optional; the diagnosis goes on
                self.count_at = None
        elif done == at + 1 and self._counter is not None:
            flops = self.stop()
            if flops:
                session.internal += 1
                try:
                    session.mon.set_flops_per_step(float(flops))
                finally:
                    session.internal -= 1

    def _skip(self, session: Any, why: str) -> None:
        """Count nothing, and say why (the report's MFU line)."""
        self.count_at = None
        session.internal += 1
        try:
            session.mon.event("flops", flops_per_step=None, skipped=why)
        finally:
            session.internal -= 1

    def stop(self) -> int | None:
        """Leave the counter (if open); the FLOPs it counted."""
        counter, self._counter = self._counter, None
        if counter is None:
            return None
        try:
            counter.__exit__(None, None, None)
            return int(counter.get_total_flops())
        except Exception:  # noqa: BLE001
            return None
