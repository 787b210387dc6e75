"""Shared benchmark helper: A and B alternated in one process, medians, the ratio.

Every speed claim in the README comes from a results file written here:
benchmarks/results/<name>-<machine>.json = {"name", "machine", "command", "date", "env",
"headline": {"label", "value", "goal", "passed"}, "results": {...}}.

Why alternate: machine drift (thermal, other processes, page cache) moves both sides alike
when A and B take turns, so the ratio of medians is stable even when absolute times are not.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

RESULTS = Path(__file__).resolve().parent / "results"


def machine_name() -> str:
    """A short, file-name-safe machine label: the GPU model if any, else CPU model and cores."""
    override = os.environ.get("TRAINSPEED_MACHINE")
    if override:
        return override
    try:
        import torch

        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0).lower().replace("nvidia", "").strip()
            return "gpu-" + "-".join(name.split())
    except Exception:  # noqa: BLE001 - a broken CUDA install still gets a CPU label
        pass
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    words = [w for w in cpu.replace("(R)", "").replace("(TM)", "").split() if w.isalnum()][:3]
    return f"cpu{os.cpu_count()}-" + "-".join(words).lower()


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def ab_compare(
    name: str,
    a_fn: Callable[[], Sequence[float]],
    b_fn: Callable[[], Sequence[float]],
    *,
    rounds: int = 10,
    labels: tuple[str, str] = ("baseline", "trainspeed"),
    warmup_rounds: int = 1,
) -> dict[str, Any]:
    """Run a_fn and b_fn alternately (ABBA order); each returns per-step times (seconds) of
    one round. Returns medians of all step times per side and the ratio median(B)/median(A),
    plus the median of per-round ratios (robust to drift between rounds)."""
    for _ in range(warmup_rounds):
        a_fn()
        b_fn()
    a_times: list[float] = []
    b_times: list[float] = []
    round_ratios: list[float] = []
    for r in range(rounds):
        order = (("a", a_fn), ("b", b_fn)) if r % 2 == 0 else (("b", b_fn), ("a", a_fn))
        got: dict[str, list[float]] = {}
        for key, fn in order:
            got[key] = list(fn())
        a_times += got["a"]
        b_times += got["b"]
        round_ratios.append(median(got["b"]) / median(got["a"]))
        print(f"  [{name}] round {r + 1}/{rounds}: {labels[0]} {median(got['a']) * 1e3:.3f} ms, "
              f"{labels[1]} {median(got['b']) * 1e3:.3f} ms, ratio {round_ratios[-1]:.4f}",
              flush=True)
    a_med, b_med = median(a_times), median(b_times)
    return {
        labels[0]: {"median_step_s": a_med, "steps": len(a_times)},
        labels[1]: {"median_step_s": b_med, "steps": len(b_times)},
        "ratio": b_med / a_med,
        "ratio_of_rounds": median(round_ratios),
        "rounds": rounds,
    }


def _env() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "cores": os.cpu_count()}
    if hasattr(os, "getloadavg"):  # the machine's load when the result was written: 1, 5, 15 min
        info["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["device"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def write_result(
    name: str,
    results: dict[str, Any],
    *,
    headline: dict[str, Any] | None = None,
    command: str | None = None,
) -> Path:
    """Write benchmarks/results/<name>-<machine>.json and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    machine = machine_name()
    payload = {
        "name": name,
        "machine": machine,
        "command": command or "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "env": _env(),
        "headline": headline,
        "results": results,
    }
    path = RESULTS / f"{name}-{machine}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def with_previous(name: str, results: dict[str, Any]) -> dict[str, Any]:
    """`results` on top of the per-recipe entries (dicts) of this machine's earlier
    <name> results file: measuring a subset of recipes keeps the others' figures."""
    previous = RESULTS / f"{name}-{machine_name()}.json"
    if not previous.exists():
        return results
    old = json.loads(previous.read_text()).get("results", {})
    return {**{k: v for k, v in old.items() if isinstance(v, dict)}, **results}


def entry_commands(results: dict[str, Any], default: str | None = None) -> str | None:
    """The commands of a file whose entries were measured by different runs, each once."""
    commands = (v.get("command", default) for v in results.values() if isinstance(v, dict))
    return "; ".join(dict.fromkeys(c for c in commands if c)) or None


def timed_steps(step: Callable[[], None], n: int, sync: Callable[[], None] | None = None) -> list[float]:
    """Per-step wall times of n calls of `step` (sync, when given, runs inside each timing:
    use torch.cuda.synchronize for GPU work so a step's time includes its kernels)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        if sync is not None:
            sync()
        out.append(time.perf_counter() - t0)
    return out


def compare_many(
    name: str,
    fns: dict[str, Callable[[], Sequence[float]]],
    *,
    rounds: int = 8,
    warmup_rounds: int = 1,
) -> dict[str, Any]:
    """Like ab_compare for several sides: the order rotates every round so each side runs
    first, second, ... equally often. Ratios are against the first side (the baseline)."""
    labels = list(fns)
    for _ in range(warmup_rounds):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {label: [] for label in labels}
    round_ratios: dict[str, list[float]] = {label: [] for label in labels[1:]}
    for r in range(rounds):
        order = labels[r % len(labels):] + labels[:r % len(labels)]
        got = {label: list(fns[label]()) for label in order}
        for label in labels:
            times[label] += got[label]
        base = median(got[labels[0]])
        for label in labels[1:]:
            round_ratios[label].append(median(got[label]) / base)
        print(f"  [{name}] round {r + 1}/{rounds}: " + ", ".join(
            f"{label} {median(got[label]) * 1e3:.3f} ms" for label in labels), flush=True)
    base = median(times[labels[0]])
    out: dict[str, Any] = {label: {"median_step_s": median(times[label]), "steps": len(times[label])}
                           for label in labels}
    for label in labels[1:]:
        out[f"ratio_{label}"] = median(times[label]) / base
        out[f"ratio_of_rounds_{label}"] = median(round_ratios[label])
    out["rounds"] = rounds
    return out


def paired_summary(a: Sequence[float], b: Sequence[float], labels: tuple[str, str]) -> dict[str, Any]:
    """Medians of two step-interleaved series (a[i] and b[i] ran back to back) and their ratio.

    Why steps, not rounds: on a small shared VM the machine's speed switches between states
    for seconds at a time (rounds of identical work differ by up to 1.4x), so a 1-2 % goal is
    unresolvable by alternating whole rounds. Two steps run back to back see the same state;
    the median of the per-pair differences is reported next to the ratio of medians."""
    a_med, b_med = median(a), median(b)
    return {
        labels[0]: {"median_step_s": a_med, "steps": len(a)},
        labels[1]: {"median_step_s": b_med, "steps": len(b)},
        "ratio": b_med / a_med,
        "median_paired_diff_us": median([y - x for x, y in zip(a, b)]) * 1e6,
        "interleaved": "step",
    }


def interleave_steps(
    a_step: Callable[[], None],
    b_step: Callable[[], None],
    steps: int,
    *,
    warmup: int = 20,
    seed: int = 0,
    b_around: Callable[[], Any] | None = None,
) -> tuple[list[float], list[float]]:
    """Two sides of interleave_sides: (A times, B times)."""
    times = interleave_sides({"a": a_step, "b": b_step}, steps, warmup=warmup, seed=seed,
                             around={"b": b_around} if b_around else None)
    return times["a"], times["b"]


def interleave_sides(
    sides: dict[str, Callable[[], None]],
    steps: int,
    *,
    warmup: int = 20,
    seed: int = 0,
    around: dict[str, Callable[[], Any]] | None = None,
) -> dict[str, list[float]]:
    """Run one step of every side per round, `steps` rounds, in a seeded random order per round
    (so work one side leaves behind, such as a background flush, lands on any side alike).
    `around[name]`, when given, returns a context manager entered before and left after each
    step of that side, outside its timing (e.g. installing hooks whose one-time cost is not
    what is measured). Returns each side's per-step wall times, warm-up rounds dropped."""
    import contextlib
    import random

    rng = random.Random(seed)
    around = around or {}
    order = [(name, fn, around.get(name) or contextlib.nullcontext) for name, fn in sides.items()]
    times: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(warmup + steps):
        rng.shuffle(order)
        for name, fn, ctx in order:
            with ctx():
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
            if i >= warmup:
                times[name].append(dt)
    return times


def trials_summary(trials: list[dict[str, list[float]]], base: str, control: str | None = None) -> dict[str, Any]:
    """Several trials of step-interleaved sides (each trial with fresh models, so a fresh memory
    layout): per trial the ratio of each side's median to the base side's, and the median of
    those ratios over trials (the headline figure). `control`, when given, is a second copy of
    the base side: its ratios (A/A) are the noise floor of this measurement on this machine."""
    sides = [name for name in trials[0] if name != base]
    out: dict[str, Any] = {"trials": len(trials), "interleaved": "step",
                           base: {"median_step_s": median([median(t[base]) for t in trials]),
                                  "steps": sum(len(t[base]) for t in trials)}}
    for name in sides:
        ratios = [median(t[name]) / median(t[base]) for t in trials]
        diffs = [median([y - x for x, y in zip(t[base], t[name])]) * 1e6 for t in trials]
        out[name] = {"median_step_s": median([median(t[name]) for t in trials]),
                     "ratio": median(ratios), "trial_ratios": [round(r, 5) for r in ratios],
                     "median_paired_diff_us": median(diffs),
                     "trial_paired_diff_us": [round(d, 1) for d in diffs]}
    if control is not None:
        out["noise_floor"] = max(abs(r - 1.0) for r in out[control]["trial_ratios"])
    return out
