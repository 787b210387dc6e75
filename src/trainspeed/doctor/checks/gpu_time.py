"""Where a CUDA step's time goes between the GPU and the host, from this run's own figures:
the GPU busy share over the measured steps (NVML, telemetry/gpu_busy.py), the host stretches
the GPU idles through (the data wait, the copies, the reads' wait) and what is left of the idle
time after them. The syncs' and the idle GPU's shares at stake are derived here, once, so the
two findings never claim the same time."""

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
        """(share at stake, its basis) of per-step reads on a GPU. A read stalls the GPU after
        it returns: the host's next work (the batch, the launches) starts only then, so the
        GPU idles for it; without the read that work runs ahead and overlaps the GPU's. The
        stall is the GPU's idle time the data and the copies do not explain (when busy is
        measured), at least the wait inside the reads; it can win at most the host's own time
        outside the reads."""
        host = max(0.0, 1.0 - self.sync_wait)
        stall = self.sync_wait
        basis = f"the wait inside the reads, {pct(self.sync_wait)} of the time"
        if self.idle_unexplained is not None and self.idle_unexplained > stall:
            stall = self.idle_unexplained
            basis = (f"the GPU idles {pct(self.idle)} of the measured steps (NVML), {pct(stall)} of it not "
                     "explained by the data wait or the copies: the stall after each read")
        if stall > host:
            basis += f"; at most the host's own time outside the reads, {pct(host)}"
        return min(stall, host), basis


def gpu_time(ctx: CheckContext) -> GpuTime:
    seconds = sum(v["seconds"] for k, v in ctx.site_totals("sync").items() if k not in CACHE_GC_KINDS)
    return GpuTime(busy=busy_of(ctx.summary), data=ctx.share("data"), h2d=ctx.share("h2d"),
                   sync_wait=ctx.time_share(seconds))


__all__ = ["CACHE_GC_KINDS", "GpuTime", "gpu_time"]
