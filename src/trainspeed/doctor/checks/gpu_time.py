"""Where a CUDA step's time goes between the GPU and the host, from this run's own figures:
the GPU busy share over the measured steps (NVML, telemetry/gpu_busy.py), the host stretches
the GPU idles through (the data wait, the copies, the wait inside the reads) and what is left
of the idle time after them (the host's own work: launches, Python between the steps). The
syncs' and the idle GPU's shares at stake are derived here, once, so the two findings never
claim the same time."""

from __future__ import annotations

from dataclasses import dataclass

from trainspeed.doctor.checks.context import CheckContext, pct
from trainspeed.telemetry.gpu_busy import busy_of

CACHE_GC_KINDS = ("empty_cache", "gc_collect")


@dataclass(frozen=True, slots=True)
class GpuTime:
    busy: float | None
    """Share of the measured steps a kernel ran (None: no valid NVML figure)."""
    data: float
    """Share of the step waiting for the next batch."""
    h2d: float
    """Share of the step in host-to-device copies."""
    sync_wait: float
    """Share of the time inside the device reads (.item(), .cpu(), ...): the host waiting for
    the GPU's queue to drain."""

    @property
    def idle(self) -> float | None:
        return None if self.busy is None else max(0.0, 1.0 - self.busy)

    @property
    def idle_unexplained(self) -> float | None:
        """GPU idle time the data wait and the copies do not account for."""
        return None if self.idle is None else max(0.0, self.idle - self.data - self.h2d)

    def sync_stake(self) -> tuple[float, str]:
        """(share at stake, its basis) of per-step reads on a GPU: the wait inside the reads.

        A step with reads takes the host's own work H plus the wait W inside the reads; without
        them the host runs ahead, and the step still takes at least H (the host's work is serial)
        and at least the GPU's work. So dropping the reads wins at most W, whatever the GPU's
        idle time says. The idle time left after the data wait and the copies is the host's own
        work (launches, Python between the steps): the launch-bound finding's, not the reads'.
        On an H100 the earlier rule (that idle time as "the stall after each read") put 69 %
        at stake on item_sync.py, and reading every 10 steps instead measured 0.96x."""
        basis = (f"the wait inside the reads, {pct(self.sync_wait)} of the time: without them the host runs "
                 "ahead, and its own work stays")
        if self.idle_unexplained is not None and self.idle_unexplained > self.sync_wait + 0.05:
            basis += (f"; the GPU also idles {pct(self.idle_unexplained - self.sync_wait)} of the measured steps "
                      "(NVML) while the host works, which the reads do not cause")
        return self.sync_wait, basis


def gpu_time(ctx: CheckContext) -> GpuTime:
    seconds = sum(v["seconds"] for k, v in ctx.site_totals("sync").items() if k not in CACHE_GC_KINDS)
    return GpuTime(busy=busy_of(ctx.summary), data=ctx.share("data"), h2d=ctx.share("h2d"),
                   sync_wait=ctx.time_share(seconds))


__all__ = ["CACHE_GC_KINDS", "GpuTime", "gpu_time"]
