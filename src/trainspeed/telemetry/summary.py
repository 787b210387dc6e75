"""Summary figures of a run: the numbers every report, check and tuner trial starts from.

`summarize(run)` is a pure function of a RunData (no clocks, no devices), so the same run
directory always gives the same summary, whoever reads it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from trainspeed.telemetry.ranks import rank_table
from trainspeed.telemetry.rundir import RunData
from trainspeed.telemetry.schema import PHASES
from trainspeed.telemetry.throughput import mfu, throughput
from trainspeed.telemetry.update_losses import losses_summary


def _precision(run: RunData, start: dict[str, Any]) -> str:
    """The precision the run trained in: the last "precision" event's (one written once the
    run's engine is known, as a DeepSpeed config's bf16 section, after run_start said fp32),
    else run_start's."""
    for event in reversed(run.events_of("precision")):
        value = (event.get("data") or {}).get("precision")
        if isinstance(value, str) and value:
            return value
    return str(start.get("precision", "fp32"))


def _flops_skipped(run: RunData) -> str | None:
    """Why no FLOPs were counted, when the counting was skipped on purpose (a compiled model
    without room for its eager counted step), else None."""
    events = run.events_of("flops")
    return str(events[-1]["data"]["skipped"]) if events and (events[-1].get("data") or {}).get("skipped") else None


def flops_per_step(run: RunData, keep: np.ndarray | None = None) -> float | None:
    """The run's FLOPs per optimizer step, or None. With a count per token (a recipe's own,
    recorded as `flops_per_token`), the mean over the steps in `keep` (a mask over the step
    records; all when None) of that count times each step's real tokens: batches of varying
    length do varying work, and the first batch's count stands for no other. Otherwise the
    last per-step measurement."""
    value = run.start_data().get("flops_per_step")
    per_token = None
    for event in run.events_of("flops"):  # a later measurement wins
        data = event.get("data") or {}
        value, per_token = data.get("flops_per_step", value), data.get("flops_per_token")
    if per_token and run.steps:
        tokens = run.array("tokens")
        tokens = tokens[keep] if keep is not None else tokens
        tokens = tokens[np.isfinite(tokens)]
        if tokens.size and tokens.mean() > 0:
            return float(per_token) * float(tokens.mean())
    return value


def peak_of(run: RunData) -> tuple[float | None, str | None]:
    """(peak FLOP/s MFU is computed against, its display name), or (None, None)."""
    peak = run.env.get("peak_flops") if isinstance(run.env, dict) else None
    for event in run.events_of("peak_flops"):
        peak = event.get("data") or peak
    if isinstance(peak, dict) and peak.get("flops"):
        name = f"{peak.get('name')} {peak.get('dtype')} ({peak.get('source')})"
        return float(peak["flops"]), name
    return None, None


def _max_or_none(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else None


def _dropped(run: RunData) -> int:
    total = 0
    for event in run.events_of("dropped_records"):
        data = event.get("data") or {}
        total += int(data.get("dropped_records", 0) or 0) + int(data.get("dropped_events", 0) or 0)
    return total


def _thinned(run: RunData) -> int:
    return sum(int(n or 0) for e in run.events_of("thinned_records")
               for n in ((e.get("data") or {}).get("sinks") or {}).values())


def summarize(run: RunData) -> dict[str, Any]:
    """The summary dict described in the shared contract (see report.json)."""
    start = run.start_data()
    n = len(run.steps)
    t_step = run.array("t_step")
    warm = run.array("warmup") > 0.5
    stats = throughput(t_step, np.nan_to_num(run.array("samples")),
                       run.array("tokens") if n else None, exclude=warm)
    keep = np.isfinite(t_step) & ~warm
    if n and not keep.any():  # a run shorter than its warm-up: report what there is
        keep = np.isfinite(t_step)

    phases: dict[str, dict[str, float | None]] = {}
    total = float(np.nansum(t_step[keep])) if n else 0.0
    for name in PHASES:
        values = run.array(f"phases.{name}")[keep] if n else np.array([])
        mean = float(np.nanmean(values)) if values.size and np.isfinite(values).any() else None
        phase_total = float(np.nansum(values)) if values.size else 0.0
        phases[name] = {"mean_s": mean, "share": (phase_total / total) if total > 0 else None}

    flops = flops_per_step(run, keep)
    peak_flops, peak_name = peak_of(run)
    mfu_result = None
    if flops:
        mfu_result = mfu(flops, stats.step_time_mean, peak_flops, peak_name).as_dict()
    elif (skipped := _flops_skipped(run)) is not None:  # the doctor chose not to count: say why
        mfu_result = {"value": None, "peak_flops": peak_flops, "peak_name": peak_name, "valid": False, "note": skipped}

    busy = _gpu_busy(run, keep, mfu_result)
    loss = run.array("loss")
    finite_loss = loss[np.isfinite(loss)]
    pad = run.array("pad_share")
    contention = _contention(run, keep)
    trend = _trend(run, keep)
    # each optimizer's own loss (a GAN's D and G), only for runs that recorded several: a run
    # with one optimizer keeps the summary it always had
    losses = losses_summary(run)
    return {
        "steps": n,
        "measured_steps": stats.steps,
        "samples_per_s": stats.samples_per_s,
        "tokens_per_s": stats.tokens_per_s if stats.tokens_per_s else None,
        "step_time": {
            "p50": stats.step_time_p50,
            "p90": stats.step_time_p90,
            "p99": stats.step_time_p99,
            "mean": stats.step_time_mean,
        },
        "phases": phases,
        "mfu": mfu_result,
        "gpu_busy": busy,
        "memory": {
            "cuda_alloc_peak": _max_or_none(run.array("mem.cuda_alloc_peak")),
            "cuda_reserved_peak": _max_or_none(run.array("mem.cuda_reserved_peak")),
            "cuda_alloc_retries": _max_or_none(run.array("mem.cuda_alloc_retries")),
            "rss_peak": _max_or_none(run.array("mem.rss")),
            "worker_rss_peak": _max_or_none(run.array("mem.worker_rss")),
        },
        "trend": trend,
        "contention": contention,
        "cpu_per_step": float(np.nanmedian(run.array("cpu")[keep])) if n and np.isfinite(run.array("cpu")[keep]).any() else None,
        "pad_share": float(np.nanmean(pad)) if np.isfinite(pad).any() else None,
        "loss": {
            "first": float(finite_loss[0]),
            "last": float(finite_loss[-1]),
            "min": float(finite_loss.min()),
        } if finite_loss.size else None,
        "syncs_per_step": float(np.nanmean(run.array("syncs")[keep])) if n and keep.any() else None,
        "dropped_records": _dropped(run),
        "thinned_records": _thinned(run),
        "device": start.get("device", "cpu"),
        "precision": _precision(run, start),
        "flops_per_step": flops,
        "ranks": rank_table({0: run.steps, **run.rank_steps}) if run.rank_steps else None,
        **({"losses": losses} if losses else {}),
    }


def system_series(run: RunData) -> dict[str, np.ndarray]:
    """The system sampler's series of the run (the last `system` event's `series`): t (wall
    clock), cpu_tree, cpu_others (% of one core), rss, children_rss; {} when not sampled."""
    for event in reversed(run.events_of("system")):
        series = (event.get("data") or {}).get("series")
        if isinstance(series, dict) and series.get("t"):
            return {k: np.array([np.nan if v is None else float(v) for v in vals], dtype=np.float64)
                    for k, vals in series.items() if isinstance(vals, list)}
    return {}


def others_per_step(run: RunData, keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float | None]:
    """(other processes' CPU, % of one core, during each step record in `keep`, the most of
    that and the neighbouring readings, the quietest reading while those steps ran); NaN where
    not sampled. See contention.load_per_step and loaded_mask."""
    from trainspeed.telemetry.contention import load_per_step

    series = system_series(run)
    t_wall = run.array("t_wall")
    if keep is not None:
        t_wall = t_wall[keep]
    if "cpu_others" not in series:
        nan = np.full(t_wall.size, np.nan)
        return nan, nan, None
    raw = load_per_step(t_wall, series["t"], series["cpu_others"], spread=0)
    floor = float(np.nanmin(raw)) if np.isfinite(raw).any() else None
    return raw, load_per_step(t_wall, series["t"], series["cpu_others"], spread=1), floor


def _gpu_busy(run: RunData, keep: np.ndarray, mfu_result: dict[str, Any] | None) -> dict[str, Any] | None:
    """GPU busy over the measured steps only (telemetry/gpu_busy.py); None without NVML rows."""
    from trainspeed.telemetry.gpu_busy import busy_window, gpu_busy

    series = system_series(run)
    if "gpu_util" not in series or not run.steps:
        return None
    mfu_value = (mfu_result or {}).get("value") if (mfu_result or {}).get("valid") else None
    window = busy_window(run.array("t_wall"), run.array("t_step"), keep)
    return gpu_busy(window, series["t"], series["gpu_util"], mfu_value)


def _contention(run: RunData, keep: np.ndarray) -> dict[str, Any] | None:
    from dataclasses import asdict

    from trainspeed.telemetry.contention import detect_contention

    if not keep.any():
        return None
    others, near, floor = others_per_step(run, keep)
    found = detect_contention(run.array("step")[keep], run.array("t_step")[keep], run.array("cpu")[keep],
                              others, floor=floor, near=near)
    return asdict(found) if found is not None else None


def robust_series(run: RunData, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], str]:
    """(steps, step times, phase times, basis) the script's own trend is judged on, over the
    steps in `keep`: the quiet steps when other processes loaded the machine for part of the
    run (basis "quiet"), else the CPU-based times (basis "cpu"), else the wall times as
    recorded (basis "wall"); under a load that changed, with too few steps level with the
    start's and no phase's share grown, all steps, undecided (basis "changing"). On a machine
    whose cores were all in use, shared with others (contention.saturated), the same steps,
    judged when a phase's share of the step grew (basis "share"), else undecided (basis
    "saturated"). See contention.robust_step_times."""
    return _robust_series(run, keep)[:4]


def _robust_series(run: RunData, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], str,
                                                            tuple[float, float] | None]:
    """robust_series, and the (first-quarter, last-quarter) median samples per step where the
    times are per sample (the steps' samples changed by work_scale.SAMPLES_CHANGE), else None."""
    from trainspeed.telemetry.contention import saturated
    from trainspeed.telemetry.work_scale import per_sample

    steps, times, phases, basis = _series(run, keep)
    scaled = per_sample(steps, times, phases, run.array("step")[keep], run.array("samples")[keep])
    work = None
    if scaled is not None:  # the steps' work changed (an RL episode per step): judged per sample
        times, phases, work = scaled
    _, cores = run_threads_cores(run)
    # Every core in use, shared with other processes: no reading shows a change of their load,
    # and this process's CPU time per step moves with what they run (module_transforms, one
    # thread, unchanged: 30 -> 57 ms from step 117, the others at 1.6-1.7 cores throughout,
    # read as 'step time grows' on the steps level with the start's). Only a phase's share of
    # the step is the script's own (phase_shares.grown_share).
    if basis != "changing" and saturated(others_per_step(run, keep)[0], own_per_step(run, keep), cores):
        return steps, times, phases, "share" if saturated_grown_phase(run, keep) else "saturated", work
    return steps, times, phases, basis, work


def saturated_grown_phase(run: RunData, keep: np.ndarray) -> str | None:
    """On a machine whose cores others kept full, the phase whose share of the step grew
    (SATURATED_SHARE_GROWTH, phase_shares.grown_share), over the steps in `keep`; None when none
    did. It, not the phase whose time rose most, is the growth a "share" trend names: there
    every phase's time moves with the others' load (the planted logging cost's share went
    0.02 -> 0.29-0.45 while backward's time, waiting for a core, rose more and was named)."""
    from trainspeed.telemetry.phase_shares import SATURATED_SHARE_GROWTH, grown_share

    return grown_share(run.array("t_step")[keep], {name: run.array(f"phases.{name}")[keep] for name in PHASES},
                       run.array("cpu")[keep], min_share=SATURATED_SHARE_GROWTH)


def _series(run: RunData, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], str]:
    """robust_series as the others' readings and this process's CPU time tell it."""
    from trainspeed.telemetry.contention import level_with_start, loaded_mask, robust_step_times
    from trainspeed.telemetry.phase_shares import share_grew

    steps, times = run.array("step")[keep], run.array("t_step")[keep]
    phases = {name: run.array(f"phases.{name}")[keep] for name in PHASES}
    cpu = run.array("cpu")[keep]
    others, near, floor = others_per_step(run, keep)
    loaded = loaded_mask(others, floor, near=near, wall=times, cpu=cpu)
    if loaded is not None and loaded.any():
        # The trend is judged on steps known to be quiet, not on those after the sampler's last
        # reading: a load that lasts to the end of the run covers them too (a second of steps
        # at 3x their quiet time, read as growth at the end of the run)
        loaded = loaded | ~np.isfinite(others)
    # The load changed during the run: only steps whose load matches the start's compare with
    # it, else the trend cannot be told. Not even CPU time per step is free of a changing load:
    # threads spin for a descheduled sibling (a data-bound script read 'step time grows',
    # critical, on CPU time 2.0x under one busy loop with 2 threads) and hyperthreads share a
    # core (one thread: +50 % beside two busy loops).
    threads, cores = run_threads_cores(run)
    with np.errstate(divide="ignore", invalid="ignore"):
        got = np.where(times > 0, cpu / times, np.nan)
    found = level_with_start(others, near, threads=threads, cores=cores, got=got)
    if found is not None and found[1]:
        matched = found[0] & ~loaded if loaded is not None else found[0]
        if matched.sum() >= MIN_TREND_STEPS:
            # quiet (not loaded) and level with the start's load
            return steps[matched], times[matched], {k: v[matched] for k, v in phases.items()}, "quiet"
        if not share_grew(times, phases, cpu):
            return steps, times, phases, "changing"
        # a load slows every phase alike; one phase's share of the step that grew is the
        # script's own growth (a history re-read at every log line): judged on CPU time below
    robust = robust_step_times(times, cpu, phases, loaded)
    if robust is None:
        return steps, times, phases, "wall"
    mask, times, phases, basis = robust
    return steps[mask], times, phases, basis


def own_per_step(run: RunData, keep: np.ndarray) -> np.ndarray:
    """This process tree's CPU (the system sampler's cpu_tree, % of one core) during each step
    record in `keep`; NaN where not sampled."""
    from trainspeed.telemetry.contention import load_per_step

    series = system_series(run)
    t_wall = run.array("t_wall")[keep]
    if "cpu_tree" not in series:
        return np.full(t_wall.size, np.nan)
    return load_per_step(t_wall, series["t"], series["cpu_tree"], spread=0)


def run_threads_cores(run: RunData) -> tuple[int | None, int | None]:
    """(torch compute threads, cores available) of the run, from env.json; None when unknown."""
    cpu = (run.env or {}).get("cpu") if isinstance(run.env, dict) else None
    cpu = cpu if isinstance(cpu, dict) else {}
    threads, cores = cpu.get("torch_threads"), cpu.get("available_cores") or cpu.get("logical_cores")
    return (int(threads) if isinstance(threads, (int, float)) and threads > 0 else None,
            int(cores) if isinstance(cores, (int, float)) and cores > 0 else None)


MIN_TREND_STEPS = 40
"""Steps a trend needs (after warm-up, loaded steps dropped): a doctor run is ~100-200 steps."""
PHASE_GROWTH_MIN = 0.05
"""A phase's own growth is reported when it adds >= 5 % of the baseline step time over the run,
even when the step total shows no trend (another phase shrank, or the total is too noisy)."""


_UNDECIDED = {"changing": "while other processes' load changed",
              "saturated": "while other processes shared every core of the machine with it"}
"""Bases of robust_series on which a trend cannot be told from the load, and why."""


def _trend(run: RunData, keep: np.ndarray) -> dict[str, Any] | None:
    from trainspeed.telemetry.contention import linear_rate
    from trainspeed.telemetry.phase_shares import machine_drift
    from trainspeed.telemetry.trend import detect_trend
    from trainspeed.telemetry.work_scale import describe

    if not keep.any():
        return None
    # work: the steps' samples changed, and the times are compared per sample
    steps, times, phases, basis, work = _robust_series(run, keep)
    found = detect_trend(steps, times, phases, min_steps=MIN_TREND_STEPS)

    def said(message: str) -> str:
        return message if work is None else f"{message.replace('step time', 'step time per sample', 1)} ({describe(work)})"

    if found is not None:
        found = replace(found, message=said(found.message))
    if basis in _UNDECIDED:
        # wall times under a load that changed, or that no reading shows: what rose may be
        # the load; said, not judged
        if found is None:
            return None
        return {"basis": basis, "kind": "undecided", "since_step": found.since_step, "phase": found.phase,
                "change": found.change, "message": (f"{found.message}, {_UNDECIDED[basis]}: "
                                                    "cannot tell the script's own trend")}
    if found is None:
        found = _phase_trend(steps, times, phases)
        found = replace(found, message=said(found.message)) if found is not None else None
    if found is None:
        return None
    if basis != "share" and machine_drift(times, phases):
        # every phase slowed alike, by no more than the machine's own speed drifts over seconds
        # (no reading of other processes shows it; CPU time moves with it): not the script's
        return None
    phase, message = found.phase, found.message
    if basis == "share":  # the phase whose share grew, not the one whose time rose most
        grown = saturated_grown_phase(run, keep)
        if grown is not None and grown != phase:
            named = f", in phase '{grown}' (its share of the step grew)"  # trend.py ends its message with the phase
            message = message.replace(f", in phase '{phase}'", named) if phase else message + named
            phase = grown
    # RSS is not slowed by other processes: all measured steps
    rss = linear_rate(run.array("step")[keep], run.array("mem.rss")[keep])
    slope_s = found.slope_per_1000 * found.baseline  # seconds per 1,000 steps
    return {
        "slope_per_1000": found.slope_per_1000,
        "since_step": found.since_step,
        "phase": phase,
        "baseline": found.baseline,
        "message": message,
        "kind": found.kind,
        "change": found.change,
        "basis": basis,
        "ms_per_1000": slope_s * 1e3,
        "rss_mb_per_1000": rss.per_1000 / 2**20 if rss is not None and rss.z >= 3 else None,
        "samples_per_step": list(work) if work is not None else None,
    }


def _phase_trend(steps: np.ndarray, times: np.ndarray, phases: dict[str, np.ndarray]):
    """The fastest-growing phase as a Trend of the step (slope relative to the step's median),
    when it adds >= PHASE_GROWTH_MIN of the step time; None otherwise."""
    from trainspeed.telemetry.trend import Trend, detect_trend

    level = float(np.nanmedian(times)) if np.isfinite(times).any() else 0.0
    if not level > 0:
        return None
    best = None
    for name, values in phases.items():
        if not np.isfinite(values).any() or not np.nanmedian(values) > 0:
            continue
        found = detect_trend(steps, values, min_slowdown=0.2, min_steps=MIN_TREND_STEPS)
        if found is None or found.kind != "growth":
            continue
        rise = found.slope_per_1000 * found.baseline / 1000.0 * float(np.nanmax(steps) - found.since_step)
        if rise >= PHASE_GROWTH_MIN * level and (best is None or rise > best[0]):
            best = (rise, name, found)
    if best is None:
        return None
    rise, name, found = best
    per_1000 = found.slope_per_1000 * found.baseline / level
    return Trend(slope_per_1000=per_1000, since_step=found.since_step, phase=name, baseline=level,
                 message=(f"phase '{name}' grows {found.slope_per_1000 * found.baseline * 1e3:.2f} ms per 1,000 "
                          f"steps since step {found.since_step} ({rise / level * 100:.0f} % of the step time)"),
                 kind="growth", change=rise / level, z=found.z)
