"""Findings about what the loop does besides training: a step time that grows, logging,
checkpointing and evaluation overhead."""

from __future__ import annotations

from typing import Any

import numpy as np

from trainspeed.doctor.checks.script_flags import (evaluation_advice, flag_note, logging_advice, script_flag, set_flag,
                                                   show_flag)
from trainspeed.doctor.checks.context import CheckContext, describe_site, ms, pct
from trainspeed.doctor.checks.machine import SPIN_MIN, busy_machine, got_text, threads_advice, torch_threads
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


def _measured(ctx: CheckContext) -> np.ndarray:
    """Mask of the measured steps (finite step time, warm-up excluded)."""
    t = ctx.run.array("t_step")
    warm = ctx.run.array("warmup") > 0.5
    return np.isfinite(t) & ~warm


def _quarter_medians(values: np.ndarray) -> tuple[float, float] | None:
    values = values[np.isfinite(values)]
    n = values.size
    if n < GROWTH_MIN_STEPS:
        return None
    q = max(5, n // 4)
    return float(np.median(values[:q])), float(np.median(values[-q:]))


def _growing_phase(phases: dict[str, np.ndarray]) -> tuple[str, float]:
    """(phase, seconds it grew by) comparing first and last quarter medians."""
    best, best_delta = "other", 0.0
    for name in ("data", "h2d", "forward", "backward", "optimizer", "log", "ckpt", "eval", "other"):
        quarters = _quarter_medians(phases.get(name, np.array([])))
        if quarters is None:
            continue
        delta = quarters[1] - quarters[0]
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
_ENGINE_GROWTH_OTHER = (
    "the engine's loop keeps no history that grows, so the growth outside its measured phases comes from "
    "what the config adds to every step: a callback (callbacks in the config or Trainer(callbacks=...)), "
    "logging.every, eval.every_steps or checkpoint.every_steps set low; re-run with each raised, and report the "
    "run as a trainspeed bug if none is set")


_BASIS = {
    "quiet": "judged on the steps other processes did not slow down, their load level with the start's",
    "cpu": "judged on this process's CPU time per step, with a core free of other processes' load",
    "share": ("judged on the phase's share of the step, which a machine-wide slowdown does not move (other "
              "processes shared every core with the run)"),
    "wall": "judged on wall time",
    "drift": ("judged on the phase's share of the step, which the machine's own speed, drifting over seconds, "
              "does not move"),
}
_SITE_CATEGORY = {"log": "log", "ckpt": "ckpt"}


def _growing_site(ctx: CheckContext, phase: str) -> str:
    """`print(...)` at train.py:36 (1.0 calls/step): the busiest recorded call site of the
    growing phase, when the doctor records sites for it."""
    category = _SITE_CATEGORY.get(phase)
    rows = ctx.sites(category) if category else []
    if not rows:
        return ""
    top = max(rows, key=lambda r: float(r.get("seconds") or 0.0))
    calls = f", {top['count'] / ctx.steps:.1f} calls/step" if ctx.steps and top.get("count") else ""
    return f" at {describe_site(top)} ({top.get('kind')}{calls})"


def step_time_growth(ctx: CheckContext) -> Finding | None:
    """The script's own step time grows. Judged on what other processes' load does not move
    (summary.robust_series: the quiet steps, else CPU time per step; on a machine whose cores
    others kept full, only a phase's share of the step), so a busy machine is
    machine_contention, never this, and a real growth is found while the machine's load goes
    up and down."""
    from trainspeed.telemetry.contention import linear_rate
    from trainspeed.telemetry.phase_shares import share_growth_ratio
    from trainspeed.telemetry.summary import robust_series
    from trainspeed.telemetry.work_scale import describe, work_factors

    trend: dict[str, Any] | None = ctx.summary.get("trend")
    if not trend:
        return None
    keep = _measured(ctx)
    if trend.get("basis") == "changing":
        # steps whose samples changed (an RL episode per step) compare per sample (work_scale.py)
        work = work_factors(ctx.run.array("samples")[keep])
        wall = _quarter_medians(ctx.run.array("t_step")[keep] / (work[0] if work is not None else 1.0))
        rose = wall is not None and wall[0] > 0 and wall[1] / wall[0] >= GROWTH_MIN_RATIO
        return _undecided_growth(ctx, trend) if rose else None
    steps, times, phases, basis = robust_series(ctx.run, keep)
    quarters = _quarter_medians(times)
    if quarters is None or quarters[0] <= 0:
        return None
    if basis == "saturated":  # the steps it would be judged on rose, and no phase's share did
        return _undecided_growth(ctx, trend) if quarters[1] / quarters[0] >= GROWTH_MIN_RATIO else None
    early, late = quarters
    phase, delta = _growing_phase(phases)
    if trend.get("phase") in _GROWTH_ADVICE and trend.get("phase") != phase:
        named = _quarter_medians(phases.get(trend["phase"], np.array([])))
        if named is not None and named[1] - named[0] > 0:
            phase, delta = trend["phase"], named[1] - named[0]
    by_share = share_growth_ratio(times, phases) if basis == "share" else None
    # on basis "share" the summary's trend names the phase whose share grew (saturated_grown_phase)
    if by_share is not None and by_share[0] == trend.get("phase"):
        # judged on a phase's share of the step (others kept every core full): that phase is the
        # growth, and the step's growth is what its share implies. Every phase's time moved with
        # the others' load: backward's, waiting for a core, rose most while the planted logging
        # cost's share went 0.02 -> 0.29-0.45, and the step's total rose x1.9-4.5
        named = _quarter_medians(phases.get(by_share[0], np.array([])))
        phase, delta = by_share[0], max(0.0, named[1] - named[0]) if named is not None else delta
        growth = (by_share[1] - 1.0) * early
    else:
        # The total rise, or the phase's own rise when the total is noisier than the phase.
        growth = max(late - early, delta)
    ratio = 1.0 + growth / early
    if ratio < GROWTH_MIN_RATIO and basis in ("quiet", "cpu"):
        # the machine's speed drifts over seconds and can hide a growth in the quarters' wall
        # times (a slow stretch at the start); the growing phase's share of the step cannot
        by_share = share_growth_ratio(times, phases)
        if by_share is not None and by_share[1] >= GROWTH_MIN_RATIO:
            phase, ratio = by_share
            named = _quarter_medians(phases.get(phase, np.array([])))
            delta = max(0.0, named[1] - named[0]) if named is not None else delta
            growth, basis = (ratio - 1.0) * early, "drift"
    if ratio < GROWTH_MIN_RATIO:
        return None
    n_run = int(np.nanmax(ctx.run.array("step"))) if ctx.steps else 0
    # The rate: a Theil-Sen line through the growing phase (else the step), over the same
    # steps; the trend's own slope is fitted from its onset and can be steep over a short span.
    rate = linear_rate(steps, phases[phase] if phase in phases and delta > 0 else times)
    per_1000_s = rate.per_1000 if rate is not None and rate.per_1000 > 0 else float(trend.get("ms_per_1000") or 0.0) / 1e3
    shown = ("outside the measured phases (\"other\": the engine's loop between them)" if phase == "other" and ctx.engine_run
             else "outside the measured phases (\"other\": your own code between them)" if phase == "other"
             else f"in phase \"{phase}\"")
    work = trend.get("samples_per_step")
    per_sample = f"; {describe(work)}, so the times are per sample, scaled to the median step" if work else ""
    evidence = (f"step time grows {per_1000_s * 1e3:.1f} ms per 1,000 steps since step {trend.get('since_step')} "
                f"({ms(early)} -> {ms(early + growth)}, x{ratio:.2f}, first vs last quarter of {times.size} steps, "
                f"{_BASIS.get(basis, basis)}{per_sample}); the growth is {shown}{_growing_site(ctx, phase)}: its time per "
                f"step grew by {ms(delta)}")
    rss_rate = trend.get("rss_mb_per_1000")
    if isinstance(rss_rate, (int, float)) and rss_rate > 0:
        evidence += f"; process RSS grows {rss_rate:.1f} MB per 1,000 steps"
    if n_run:
        projected = early + growth + per_1000_s / 1000.0 * 9 * n_run  # from the last quarter on
        evidence += (f"; at 10x the steps run ({10 * n_run}) a step would take ~{ms(projected)} "
                     f"(x{projected / early:.1f}, linear projection)")
    notes = _correlates(ctx)
    if notes:
        evidence += "; meanwhile " + "; ".join(notes)
    return Finding(
        id="step_time_growth",
        severity="critical" if ratio >= GROWTH_CRITICAL_RATIO else "warning",
        title="Step time grows over the run",
        evidence=evidence,
        recommendation=(_ENGINE_GROWTH_OTHER if ctx.engine_run and phase == "other"
                        else _GROWTH_ADVICE.get(phase, _GROWTH_ADVICE["other"])),
        verify_with=f"{ctx.doctor_command(steps=1000)} (the trend should be flat)",
        impact=growth / (early + growth),
    )


def _undecided_growth(ctx: CheckContext, trend: dict[str, Any]) -> Finding:
    """The wall time per step rose while other processes' load changed, with too few steps at
    the start's load to compare them with: nothing the run measured tells a slower script from
    a busier machine (even CPU time per step moves with the load: spinning threads, shared
    hyperthreads). Or it rose while other processes kept every core in use, where no reading
    shows their load change and no phase's share of the step grew (summary basis "saturated").
    Said at info level, nothing at stake."""
    threads = torch_threads(ctx)
    if trend.get("basis") == "saturated":
        title = "Step time rose while other processes used every core: cannot tell whether the script slows down"
        why = ("other processes shared every core with the run, so their readings cannot show a change of their "
               "load, and this process's CPU time per step moves with what they run (caches, memory bandwidth); "
               "every phase rose alike, none's share of the step grew")
    else:
        title = "Step time rose while the machine's load changed: cannot tell whether the script slows down"
        why = ("too few steps ran at the start's load to compare, and neither wall time nor this process's CPU "
               "time per step is free of a changing load (compute threads spin for a descheduled sibling, "
               "hyperthreads share a core)")
    return Finding(
        id="step_time_growth",
        severity="info",
        title=title,
        evidence=f"{trend.get('message')}; {why}",
        recommendation=("re-run on a quiet machine, or on cores of its own (taskset -c), with more steps; a "
                        "trend that is the script's shows there too" + (threads_advice(ctx, {"threads": threads})
                                                                     if threads else "")),
        verify_with=f"{ctx.doctor_command(steps=1000)} (on a quiet machine)",
        impact=0.0,
    )


CONTENTION_WARNING = 0.2
"""Other processes took >= 20 % of the run's wall time: the run's own figures (throughput,
phase times) are that much off, worth a warning although nothing in the script is at fault."""


def machine_contention(ctx: CheckContext) -> Finding | None:
    """Steps slowed down by other processes on the machine (summary's `contention`): not the
    script's fault, so 0 % of its time is at stake; said so that nobody hunts a slowdown in
    the code, and that the run's figures are read with it in mind."""
    found: dict[str, Any] | None = ctx.summary.get("contention")
    if not found:
        return None
    lost = float(found.get("lost_share") or 0.0)
    how = ("the system sampler saw their CPU use" if found.get("sampled")
           else "inferred: wall time rose while this process's CPU time did not (no system samples)")
    evidence = (f"{found.get('message')}; the load took {pct(lost)} of the run's wall time ({how}). "
                "Phase times and the step-time trend of the script were judged without it")
    # The quiet steps may have been loaded too (word_language_model beside a test suite: 1.4
    # cores of 2 taken in its 'quiet' steps): then no step of the run is the script's own speed.
    quiet = found.get("others_quiet")
    busy = busy_machine(ctx, quiet) if found.get("sampled") and isinstance(quiet, (int, float)) else None
    if busy:
        evidence += (f". Even the quiet steps ran beside {busy['others']:.1f} of the machine's {busy['cores']} cores "
                     f"taken by other processes{got_text(busy, ctx)}: every time of this run is pessimistic")
    # CPU time per step that grows under the load is threads spinning (chargpt, 2 threads: 41.6
    # -> 154.5 ms of CPU per step while its wall time went 23 -> 246 ms): fewer threads may help.
    threads = torch_threads(ctx)
    spin = float(found.get("cpu_change") or 0.0) + 1.0
    if spin >= SPIN_MIN and (threads or 0) >= 2:
        evidence += (f". Its CPU time per step rose {spin:.1f}x under the load with {threads} compute threads: "
                     "threads that wait for a descheduled sibling spin")
        busy = busy or {"threads": threads}
    return Finding(
        id="machine_contention",
        severity="warning" if lost >= CONTENTION_WARNING else "info",
        title="Other processes slowed this run down (not the script)",
        evidence=evidence,
        recommendation=("nothing to change in the script: other processes used the CPU cores it needs. "
                        "Measure when the machine is quiet, or give the run cores of its own (taskset -c / "
                        "a dedicated node); throughput and step times of this run are pessimistic"
                        + (threads_advice(ctx, busy) if busy else "")),
        verify_with=f"{ctx.doctor_command()} (on a quiet machine)",
        impact=0.0,
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
        recommendation=(f"{logging_advice(ctx)}, keep metrics on the device until then, and write from a "
                        "background thread (engine: logging.every=50, async sinks)"),
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


def _save_interval(ctx: CheckContext, saves: int) -> float:
    """Steps between saves: the median gap between steps with checkpoint time (a save every 2
    steps reads 2, not the 2.2 of 9 saves in 20 steps), else steps per save."""
    ckpt = np.nan_to_num(ctx.run.array("phases.ckpt"))
    steps = np.flatnonzero(ckpt > 0)
    if steps.size >= 2:
        return float(np.median(np.diff(steps)))
    return ctx.steps / saves


def checkpointing(ctx: CheckContext) -> Finding | None:
    """Saving takes a large share of the time or happens every few steps. A save is one call
    (torch.save, or a framework's save_checkpoint however many files it writes)."""
    saves = [e.get("data") or {} for e in ctx.run.events_of("checkpoint")]
    share = ctx.share("ckpt")
    if not saves or not ctx.steps:
        return None
    every = _save_interval(ctx, len(saves))
    too_often = every < CKPT_OFTEN_STEPS and share >= CKPT_OFTEN_MIN_SHARE
    if share < CKPT_WARNING and not too_often:
        return None
    # doctor runs time the save call ("seconds"); engine runs record what blocked training
    seconds = float(np.median([float(s.get("seconds") or s.get("blocking_s") or 0.0) for s in saves]))
    sizes = [s.get("bytes") for s in saves if isinstance(s.get("bytes"), (int, float))]
    files = [s.get("files") for s in saves if isinstance(s.get("files"), int)]
    step = ctx.step_mean or 0.0
    interval = _nice(seconds / (CKPT_TARGET * step)) if step > 0 and seconds > 0 else 1000
    rows = ctx.sites("ckpt")
    where = f" at {describe_site(rows[0]) if rows[0].get('via') else rows[0]['site']}" if rows else ""
    size_text = f", {np.median(sizes) / 2**20:.1f} MiB each" if sizes else ""
    if files and max(files) > 1:
        size_text += f" in {int(np.median(files))} files"
    every_text = ("every step" if every == 1 else f"every {every:.0f} steps" if float(every).is_integer()
                  else f"every {every:.1f} steps")
    flag = script_flag(ctx, "checkpoint_interval")
    value = flag.get("value") if flag else None
    if flag and isinstance(value, int) and not isinstance(value, bool) and value < interval:
        # the script's own interval flag: the change is an argument, not code or our engine
        recommendation = (f"save less often: {set_flag(flag, interval)} (now {show_flag(flag)}), so saving "
                          f"stays under {CKPT_TARGET:.0%} of the time; or save every N minutes")
    elif any(str(s.get("path", "")).endswith(".ds") for s in saves):
        # DeepSpeed's save_checkpoint writes before it returns: no background write to offer
        recommendation = (f"save every >= {interval} steps so saving stays under {CKPT_TARGET:.0%} of "
                          f"the time (engine: checkpoint.every_steps={interval})")
    else:
        recommendation = (f"save every >= {interval} steps (or every N minutes) so saving stays under "
                          f"{CKPT_TARGET:.0%} of the time, and write in the background "
                          f"(engine: checkpoint.every_steps={interval} checkpoint.async_save=true)")
    return Finding(
        id="checkpointing",
        severity="critical" if share >= 0.3 else "warning",
        title="Checkpointing too often" if too_often else "Checkpointing is slow",
        evidence=(f"{len(saves)} saves in {ctx.steps} steps ({every_text}){where}, "
                  f"{ms(seconds)} each{size_text}: {pct(share)} of step time{flag_note(ctx, 'checkpoint_interval')}"),
        recommendation=recommendation,
        verify_with=ctx.tune_command("checkpoint"),
        impact=share,
    )


def evaluation_share(ctx: CheckContext) -> Finding | None:
    from trainspeed.doctor.checks.rollout import is_rollout

    share = ctx.share("eval")
    if share < EVAL_WARNING or is_rollout(ctx):  # an RL rollout is the data, not an evaluation
        return None
    extra, advice = evaluation_advice(ctx)
    return Finding(
        id="evaluation_share",
        severity="critical" if share >= EVAL_CRITICAL else "warning",
        title="Evaluation takes a large share of the training time",
        evidence=(f"evaluation (forward passes under no_grad/eval() and their data) takes {pct(share)} "
                  f"of step time ({ms(ctx.phase_mean('eval'))} per training step){extra}"),
        recommendation=advice,
        verify_with=ctx.tune_command("eval"),
        impact=share,
    )


CHECKS = (step_time_growth, machine_contention, logging_overhead, checkpointing, evaluation_share)
