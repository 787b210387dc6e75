"""Host-sync findings: reads of device values every step, and cache/GC calls in the loop."""

from __future__ import annotations

import linecache
import re
from typing import Any

from trainspeed.doctor.checks.context import CheckContext, describe_site, ms, pct
from trainspeed.doctor.findings import Finding

SYNCS_PER_STEP_WARNING = 0.5
"""A device read (`.item()`, `.cpu()`, `float(t)`...) at least every other step: each one
drains the GPU's queue, so the CPU cannot run ahead and kernel launches stop overlapping
(PyTorch Performance Tuning Guide, "avoid unnecessary CPU-GPU synchronization")."""
SYNCS_PER_STEP_CRITICAL = 10.0
"""Ten or more per step on a GPU: the loop is effectively synchronous."""
CUDA_SYNC_MIN_IMPACT = 0.05
"""On CUDA the cost of a sync is lost overlap, which the time spent inside the call
under-states; we assume at least this share of the step is at stake."""
CACHE_GC_PER_STEP_WARNING = 0.5
"""`torch.cuda.empty_cache()` / `gc.collect()` at least every other step (PyTorch CUDA
semantics docs: empty_cache does not free memory for PyTorch and forces re-allocation;
gc.collect walks every Python object)."""
CACHE_GC_KINDS = ("empty_cache", "gc_collect")
_LABELS = {"empty_cache": "torch.cuda.empty_cache()", "gc_collect": "gc.collect()"}

KNOWN_LIBRARY_SYNCS: tuple[tuple[str, str, str], ...] = (
    ("transformers", "logging_nan_inf_filter",
     "TrainingArguments(logging_nan_inf_filter=False) (the Trainer checks every step's loss for "
     "NaN/Inf on the host when it is on, the default)"),
)
"""(package, text near the calling line, the setting that removes the read)."""


def library_of(site: str) -> str | None:
    """The installed package a call site lies in (None: the user's own code)."""
    match = re.search(r"[/\\](?:site|dist)-packages[/\\]([^/\\]+)[/\\]", site)
    return match.group(1) if match else None


def library_advice(row: dict[str, Any], lookahead: int = 5) -> str | None:
    """The known setting that removes a library's per-step read, from the calling lines."""
    site = str(row.get("site", ""))
    package = library_of(site)
    filename, _, lineno = site.rpartition(":")
    if package is None or not lineno.isdigit():
        return None
    text = " ".join(linecache.getline(filename, int(lineno) + k) for k in range(lookahead))
    for pkg, marker, advice in KNOWN_LIBRARY_SYNCS:
        if pkg == package and marker in text:
            return advice
    return None


def _fix(first: dict[str, Any] | None) -> str:
    generic = ("keep the value on the device (`total += loss.detach()`) and read it only every K steps "
               "when you log; replace `if tensor:` checks by device-side ops (torch.where, "
               "torch.nan_to_num) (engine: logging.every=50)")
    if first is None:
        return generic
    package = library_of(str(first.get("site", "")))
    if package is None:
        return f"For {describe_site(first)}: {generic}"
    advice = library_advice(first)
    return (f"the top read happens inside {package} ({describe_site(first)}), not in your code: "
            + (f"set {advice}" if advice else
               f"look for the {package} option that reads a value every step (logging, NaN checks, "
               "metrics), or train with the engine, which reads device values at the log interval only"))


def host_syncs(ctx: CheckContext) -> Finding | None:
    if not ctx.steps:
        return None
    totals = {k: v for k, v in ctx.site_totals("sync").items() if k not in CACHE_GC_KINDS}
    count = sum(v["count"] for v in totals.values())
    per_step = count / ctx.steps
    if per_step < SYNCS_PER_STEP_WARNING:
        return None
    seconds = sum(v["seconds"] for v in totals.values())
    rows = [r for r in ctx.sites("sync") if r.get("kind") not in CACHE_GC_KINDS]
    top = "; ".join(f"{describe_site(r)} ({r['kind']}, {r['count'] / ctx.steps:.1f}/step)" for r in rows[:3])
    cuda = ctx.device_type == "cuda"
    share = ctx.time_share(seconds)
    impact = max(share, CUDA_SYNC_MIN_IMPACT) if cuda else share
    where = "" if cuda else (" On this CPU run a read costs little, but on a GPU each one stalls "
                             "the pipeline.")
    first = rows[0] if rows else None
    return Finding(
        id="host_syncs",
        severity="critical" if cuda and per_step >= SYNCS_PER_STEP_CRITICAL else "warning",
        title="The loop reads device values every step (host syncs)",
        evidence=(f"{per_step:.1f} host syncs per step ({count} in {ctx.steps} steps, {ms(seconds)} inside "
                  f"them = {pct(share)} of the time); top: {top}.{where}"),
        recommendation=_fix(first),
        verify_with=f"{ctx.doctor_command()} (syncs per step should drop below 0.1)",
        impact=impact,
    )


def cache_gc_in_loop(ctx: CheckContext) -> Finding | None:
    if not ctx.steps:
        return None
    totals = {k: v for k, v in ctx.site_totals("sync").items() if k in CACHE_GC_KINDS}
    calls = {k: v["count"] / ctx.steps for k, v in totals.items()}
    hot = {k: v for k, v in calls.items() if v >= CACHE_GC_PER_STEP_WARNING}
    if not hot:
        return None
    seconds = sum(totals[k]["seconds"] for k in hot)
    share = ctx.time_share(seconds)
    rows = [r for r in ctx.sites("sync", tuple(hot)) if r.get("count")]
    sites = "; ".join(f"{describe_site(r)} ({r['count'] / ctx.steps:.1f}/step)" for r in rows[:3])
    names = " and ".join(_LABELS[k] for k in sorted(hot))
    return Finding(
        id="cache_gc_in_loop",
        severity="warning",
        title=f"{names} runs inside the training loop",
        evidence=(", ".join(f"{_LABELS[k]} {v:.1f} per step" for k, v in sorted(hot.items()))
                  + f", {ms(seconds)} in total = {pct(share)} of the time; at {sites}"),
        recommendation=("remove them from the loop: empty_cache hands cached blocks back to the driver only "
                        "for PyTorch to re-allocate them (a sync each time), and gc.collect walks every Python "
                        "object. If memory is the reason, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; "
                        "call gc.freeze() after setup to shrink GC pauses"),
        verify_with=ctx.doctor_command(),
        impact=share,
    )


CHECKS = (host_syncs, cache_gc_in_loop)
