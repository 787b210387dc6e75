"""Findings about what the loop does besides training: a step time that grows, logging,
checkpointing and evaluation overhead."""

from __future__ import annotations

from typing import Any

import numpy as np

from trainspeed.doctor.checks.context import CheckContext, describe_site, ms, pct
from trainspeed.doctor.findings import Finding

GROWTH_MIN_RATIO = 1.2
"""Report a growing step time only when the last quarter of the measured steps is >= 20 %
slower (median) than the first quarter; a statistically significant but small drift is noise
for a diagnosis (do not cry wolf)."""
GROWTH_CRITICAL_RATIO = 2.0
"""Twice as slow by the end of a short doctor run: a long run will crawl."""
GROWTH_MIN_STEPS = 20
"""Quarters of fewer than 5 steps are too noisy to compare."""
RSS_GROWTH_NOTE = 16 * 2**20
"""Resident memory growing by more than 16 MiB during the run is worth naming as a correlate."""
LOG_WARNING = 0.05
"""Logging above 5 % of step time: synchronous per-step logging (print/TensorBoard/W&B) is a
classic hidden cost (PyTorch Lightning's `log_every_n_steps` defaults to 50 for this reason)."""
LOG_CRITICAL = 0.20
CKPT_WARNING = 0.05
"""Checkpointing above 5 % of the run (Check-N-Run, CheckFreq: keep checkpoint overhead to a
few percent by choosing the interval from the save cost)."""
CKPT_TARGET = 0.02
"""The interval we recommend keeps saving at <= 2 % of the time."""
CKPT_OFTEN_STEPS = 10
"""Saving more often than every 10 steps is "too often" whatever it costs today."""
CKPT_OFTEN_MIN_SHARE = 0.01
EVAL_WARNING = 0.10
"""Evaluation above 10 % of the time: evaluate less often or on a subset (common practice:
eval every few hundred/thousand steps)."""
EVAL_CRITICAL = 0.30


def _measured(ctx: CheckContext) -> tuple[np.ndarray, np.ndarray]:
    t = ctx.run.array("t_step")
    warm = ctx.run.array("warmup") > 0.5
    keep = np.isfinite(t) & ~warm
    return t[keep], keep


def _quarter_medians(values: np.ndarray) -> tuple[float, float] | None:
    n = values.size
    if n < GROWTH_MIN_STEPS:
        return None
    q = max(5, n // 4)
    return float(np.median(values[:q])), float(np.median(values[-q:]))


def _growing_phase(ctx: CheckContext, keep: np.ndarray) -> tuple[str, float]:
    """(phase, seconds it grew by) comparing first and last quarter means."""
    best, best_delta = "other", 0.0
    n = int(keep.sum())
    q = max(5, n // 4)
    for name in ("data", "h2d", "forward", "backward", "optimizer", "log", "ckpt", "eval", "other"):
        values = ctx.run.array(f"phases.{name}")[keep]
        if values.size < 2 * q:
            continue
        delta = float(np.nanmedian(values[-q:]) - np.nanmedian(values[:q]))
        if delta > best_delta:
            best, best_delta = name, delta
    return best, best_delta


def _first_last(values: np.ndarray) -> tuple[float, float] | None:
    finite = values[np.isfinite(values)]
    return (float(finite[0]), float(finite[-1])) if finite.size >= 2 else None


def _correlates(ctx: CheckContext) -> list[str]:
    notes: list[str] = []
    for key, label in (("mem.rss", "process RSS"), ("mem.worker_rss", "DataLoader worker RSS")):
        fl = _first_last(ctx.run.array(key))
        if fl and fl[1] - fl[0] > RSS_GROWTH_NOTE:
            notes.append(f"{label} grew {(fl[1] - fl[0]) / 2**20:.0f} MiB ({fl[0] / 2**20:.0f} -> {fl[1] / 2**20:.0f} MiB)")
    files = ctx.first("files") or {}
    grown = files.get("grown") or []
    if grown:
        top = grown[0]
        notes.append(f"{len(grown)} file(s) grew, most {top.get('path')} (+{int(top.get('grew') or 0) / 1024:.0f} KiB)")
    ckpt = ctx.first("checkpoint_files") or {}
    if (ckpt.get("existing") or 0) > 1:
        notes.append(f"{ckpt['existing']} checkpoint files now on disk ({int(ckpt.get('bytes') or 0) / 2**20:.1f} MiB)")
    log_calls = sum(t["count"] for t in ctx.site_totals("log").values())
    if log_calls and ctx.steps:
        notes.append(f"{log_calls / ctx.steps:.1f} logging calls per step")
    return notes


_GROWTH_ADVICE = {
    "log": ("logging gets slower as the run goes on: something re-reads or re-writes a growing history "
            "when it logs. Log running aggregates (a sum and a count, or a fixed-size deque) every K steps"),
    "ckpt": "checkpoints get bigger or more numerous: keep the last few (engine: checkpoint.keep_last=3)",
    "data": ("the input pipeline slows down over time (a cache that grows, a dataset that accumulates "
             "state, workers that leak memory); check __getitem__ for state that grows"),
    "eval": "evaluation gets slower: check for an evaluation set or metric state that grows every call",
    "other": ("your own code between the measured phases does work proportional to the run length: "
              "typically a Python list that keeps growing and is re-read every step (sum/mean/np.mean "
              "over the whole history, or stored loss tensors that keep graphs alive). Keep running "
              "aggregates (a sum and a count) or a fixed-size collections.deque, and store .detach()ed "
              "values read at the log interval"),
}


def step_time_growth(ctx: CheckContext) -> Finding | None:
    times, keep = _measured(ctx)
    quarters = _quarter_medians(times)
    if quarters is None:
        return None
    early, late = quarters
    if early <= 0:
        return None
    ratio = late / early
    # The summary's trend detector (robust slope + noise test) decides whether anything grows;
    # quartile medians alone are fooled by other tenants of a shared machine.
    trend: dict[str, Any] | None = ctx.summary.get("trend")
    if not trend or ratio < GROWTH_MIN_RATIO:
        return None
    phase, delta = _growing_phase(ctx, keep)
    if trend.get("phase") in _GROWTH_ADVICE and trend.get("phase") != phase and delta <= 0:
        phase = trend["phase"]
    shown = "outside the measured phases (\"other\": your own code)" if phase == "other" else f"in phase \"{phase}\""
    evidence = (f"step time grew from {ms(early)} to {ms(late)} (x{ratio:.2f}, first vs last quarter of "
                f"{times.size} measured steps); the growth is {shown} (its median per step grew by {ms(delta)})")
    if trend.get("message"):
        evidence += f"; trend: {trend['message']}"
    notes = _correlates(ctx)
    if notes:
        evidence += "; meanwhile " + "; ".join(notes)
    return Finding(
        id="step_time_growth",
        severity="critical" if ratio >= GROWTH_CRITICAL_RATIO else "warning",
        title="Step time grows over the run",
        evidence=evidence,
        recommendation=_GROWTH_ADVICE.get(phase, _GROWTH_ADVICE["other"]),
        verify_with=f"{ctx.doctor_command(steps=1000)} (the trend should be flat)",
        impact=(late - early) / late,
    )


def logging_overhead(ctx: CheckContext) -> Finding | None:
    share = ctx.share("log")
    if share < LOG_WARNING:
        return None
    rows = ctx.sites("log")
    where = ""
    if rows and ctx.steps:
        top = rows[0]
        where = f"; busiest: {describe_site(top)} ({top['kind']}, {top['count'] / ctx.steps:.1f} calls/step)"
    return Finding(
        id="logging_overhead",
        severity="critical" if share >= LOG_CRITICAL else "warning",
        title="Logging costs a large share of every step",
        evidence=f"logging takes {pct(share)} of step time ({ms(ctx.phase_mean('log'))} per step){where}",
        recommendation=("log every K steps instead of every step (`if step % 50 == 0:`), keep metrics on the "
                        "device until then, and write from a background thread (engine: logging.every=50, "
                        "async sinks)"),
        verify_with=ctx.tune_command("logging"),
        impact=share,
    )


def _nice(x: float) -> int:
    """The smallest of 10, 20, 50, 100, 200, 500, ... that is >= x."""
    base = 10
    while True:
        for m in (1, 2, 5):
            if base * m >= x:
                return base * m
        base *= 10


def checkpointing(ctx: CheckContext) -> Finding | None:
    saves = [e.get("data") or {} for e in ctx.run.events_of("checkpoint")]
    share = ctx.share("ckpt")
    if not saves or not ctx.steps:
        return None
    every = ctx.steps / len(saves)
    too_often = every < CKPT_OFTEN_STEPS and share >= CKPT_OFTEN_MIN_SHARE
    if share < CKPT_WARNING and not too_often:
        return None
    seconds = float(np.median([float(s.get("seconds") or 0.0) for s in saves]))
    sizes = [s.get("bytes") for s in saves if isinstance(s.get("bytes"), (int, float))]
    step = ctx.step_mean or 0.0
    interval = _nice(seconds / (CKPT_TARGET * step)) if step > 0 and seconds > 0 else 1000
    rows = ctx.sites("ckpt")
    where = f" at {rows[0]['site']}" if rows else ""
    size_text = f", {np.median(sizes) / 2**20:.1f} MiB each" if sizes else ""
    return Finding(
        id="checkpointing",
        severity="critical" if share >= 0.3 else "warning",
        title="Checkpointing too often" if too_often else "Checkpointing is slow",
        evidence=(f"{len(saves)} saves in {ctx.steps} steps (every {every:.1f} steps){where}, "
                  f"{ms(seconds)} each{size_text}: {pct(share)} of step time"),
        recommendation=(f"save every >= {interval} steps (or every N minutes) so saving stays under "
                        f"{CKPT_TARGET:.0%} of the time, and write in the background "
                        f"(engine: checkpoint.every_steps={interval} checkpoint.async_save=true)"),
        verify_with=ctx.tune_command("checkpoint"),
        impact=share,
    )


def evaluation_share(ctx: CheckContext) -> Finding | None:
    share = ctx.share("eval")
    if share < EVAL_WARNING:
        return None
    return Finding(
        id="evaluation_share",
        severity="critical" if share >= EVAL_CRITICAL else "warning",
        title="Evaluation takes a large share of the training time",
        evidence=(f"evaluation (forward passes under no_grad/eval() and their data) takes {pct(share)} "
                  f"of step time ({ms(ctx.phase_mean('eval'))} per training step)"),
        recommendation=("evaluate every N steps instead of every step, on a fixed subset, under "
                        "torch.inference_mode() (engine: eval.every_steps=500)"),
        verify_with=None,
        impact=share,
    )


CHECKS = (step_time_growth, logging_overhead, checkpointing, evaluation_share)
