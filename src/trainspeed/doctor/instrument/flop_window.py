"""The FLOPs of one real step of the script, for MFU: FlopCounterMode is entered at one step
boundary and left at the next, instead of re-running the user's model (which we cannot do
safely). The counted step runs slower, so it is marked as warm-up.

A compiled model runs that one step eagerly under the counter (TorchDynamo runs the frames as
written while a dispatch mode is active, and does not recompile: torch 2.13, a compiled MLP
counted exactly its eager FLOPs, its graph count unchanged). llama2.c with --compile=True read
"MFU not measured" where its eager run read 18.9 %. An eager step can need more memory than the
compiled one (no fusion), so on a GPU it is counted only with room to spare."""

from __future__ import annotations

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


class FlopWindow:
    def __init__(self, count_at: int | None) -> None:
        self.count_at = count_at
        """The step after which counting starts (None: never, or given up)."""
        self._counter: Any = None

    @property
    def counting(self) -> bool:
        return self._counter is not None

    def after_step(self, session: Any) -> None:
        """Called at every step boundary: open the window at `count_at`, close it one step later."""
        at = self.count_at
        if at is None:
            return
        done = session.mon.steps_done
        if done == at and self._counter is None:
            if session.observations.get("compiled") and not room_for_an_eager_step():
                self.count_at = None  # its eager step could run out of memory: the report says why
                session.internal += 1
                try:
                    session.mon.event("flops", flops_per_step=None, skipped=NO_ROOM)
                finally:
                    session.internal -= 1
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
