"""Side-by-side comparison of two runs' summaries: pure rows, rendered by terminal and HTML.

Every row carries A's and B's value, the ratio B/A, and the ratio read as words
("1.83x faster"), with the direction that is better for that metric.

A ratio alone does not say whether B is faster or the runs were noisy, nor whether the two
runs did the same work. `comparability(a, b)` adds both: the 95 % bootstrap interval of the
throughput ratio (ratio of median per-step throughputs, resampling each run's steady-state
steps), and a warning for each way the runs differ in what they measured (model, data,
device, world size).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from trainspeed.report.fmt import fmt_bytes, fmt_ms, fmt_rate, is_num, ratio, verdict
from trainspeed.telemetry.schema import PHASES

MEMORY_KEYS = (
    ("cuda_alloc_peak", "device allocated peak"),
    ("cuda_reserved_peak", "device reserved peak"),
    ("rss_peak", "host RSS peak"),
    ("worker_rss_peak", "workers RSS peak"),
)


def _row(group: str, metric: str, a: Any, b: Any, kind: str, *, higher_is_better: bool) -> dict[str, Any]:
    r = ratio(a, b)
    noun = ("less", "more") if kind == "bytes" else ("faster", "slower")
    return {
        "group": group,
        "metric": metric,
        "a": a if is_num(a) else None,
        "b": b if is_num(b) else None,
        "kind": kind,
        "ratio": r,
        "verdict": verdict(r, higher_is_better=higher_is_better, noun=noun),
    }


NOISE = "within the noise"
"""The reading of a row whose ratio lies inside the measured noise: no colour, no direction."""


def _noise_row(interval: RatioInterval) -> dict[str, Any]:
    """The row the headline reads: the throughput ratio with the interval (median per step)."""
    row = _row("throughput", f"{interval.metric}, median per step", interval.a_median, interval.b_median, "rate",
               higher_is_better=True)
    row["ratio"] = interval.ratio
    row["verdict"] = verdict(interval.ratio, higher_is_better=True) if interval.significant else NOISE
    return row


def _inside_noise(row: dict[str, Any], interval: RatioInterval) -> bool:
    """A speed row whose ratio lies inside the throughput interval moved to centre on 1 (its
    relative spread): the runs' step-to-step noise could make it (a 1.03 beside a 0.91-1.33
    interval). Phases and memory have no interval of their own and keep their reading."""
    if row["group"] not in ("throughput", "step time") or row["ratio"] is None or not interval.ratio:
        return False
    speedup = row["ratio"] if row["group"] == "throughput" else 1.0 / row["ratio"]
    return interval.low / interval.ratio <= speedup <= interval.high / interval.ratio


def compare_rows(sa: dict[str, Any], sb: dict[str, Any], interval: RatioInterval | None = None) -> list[dict[str, Any]]:
    """Rows for throughput, step time, each phase with time in either run, and memory peaks.
    With the throughput ratio's interval, its own row comes first (the ratio the headline
    reads), and a speed row inside the noise reads 'within the noise' instead of faster/slower."""
    rows = [
        _row("throughput", "samples/s", sa.get("samples_per_s"), sb.get("samples_per_s"), "rate", higher_is_better=True),
    ]
    if is_num(sa.get("tokens_per_s")) or is_num(sb.get("tokens_per_s")):
        rows.append(_row("throughput", "tokens/s", sa.get("tokens_per_s"), sb.get("tokens_per_s"), "rate",
                         higher_is_better=True))
    sta, stb = sa.get("step_time") or {}, sb.get("step_time") or {}
    for q in ("p50", "p90", "p99"):
        rows.append(_row("step time", q, sta.get(q), stb.get(q), "seconds", higher_is_better=False))
    pa, pb = sa.get("phases") or {}, sb.get("phases") or {}
    for phase in PHASES:
        a = (pa.get(phase) or {}).get("mean_s")
        b = (pb.get(phase) or {}).get("mean_s")
        if (is_num(a) and a > 0) or (is_num(b) and b > 0):
            rows.append(_row("phase", phase, a, b, "seconds", higher_is_better=False))
    ma, mb = sa.get("memory") or {}, sb.get("memory") or {}
    for key, label in MEMORY_KEYS:
        if is_num(ma.get(key)) or is_num(mb.get(key)):
            rows.append(_row("memory", label, ma.get(key), mb.get(key), "bytes", higher_is_better=False))
    if interval is None:
        return rows
    for row in rows:
        if _inside_noise(row, interval):
            row["verdict"] = NOISE
    return [_noise_row(interval), *rows]


def fmt_value(value: Any, kind: str) -> str:
    if kind == "seconds":
        return f"{fmt_ms(value)} ms" if is_num(value) else "—"
    if kind == "bytes":
        return fmt_bytes(value)
    if kind == "rate":
        return fmt_rate(value, "").strip() if is_num(value) else "—"
    return str(value) if value is not None else "—"


def headline(rows: list[dict[str, Any]], interval: RatioInterval | None = None) -> str | None:
    """One sentence for the top of a comparison. With the throughput ratio's interval, that
    ratio and its reading (a 1.15x inside a 0.83-2.30 interval is no difference); else the most
    informative throughput row."""
    if interval is not None:
        bounds = f"{interval.level:.0%} interval {interval.low:.2f}-{interval.high:.2f}"
        if not interval.significant:
            return (f"B and A are within the noise of each other ({interval.metric}, median per step: "
                    f"B/A = {interval.ratio:.2f}, {bounds})")
        factor = interval.ratio if interval.ratio > 1 else 1 / interval.ratio
        words = "faster" if interval.ratio > 1 else "slower"
        return f"B is {factor:.2f}x {words} than A ({interval.metric}, median per step: B/A = {interval.ratio:.2f}, {bounds})"
    best = next((r for r in rows if r["group"] == "throughput" and r["metric"] == "tokens/s" and r["ratio"]), None)
    best = best or next((r for r in rows if r["group"] == "throughput" and r["ratio"]), None)
    best = best or next((r for r in rows if r["group"] == "step time" and r["metric"] == "p50" and r["ratio"]), None)
    if best is None:
        return None
    words = "as fast as" if best["verdict"] == "same" else f"{best['verdict']} than"
    return f"B is {words} A ({best['group']} {best['metric']}, B/A = {best['ratio']:.2f})"


# --------------------------------------------------------------------------- noise and sameness

BOOTSTRAP_RESAMPLES = 2000
"""Bootstrap resamples of each run's steps (fewer for very long runs: at most ~4M values drawn)."""
MIN_STEPS = 5
"""Steady-state steps each run needs for an interval."""


@dataclass(kw_only=True, slots=True)
class RatioInterval:
    """Throughput ratio B/A (ratio of median per-step throughputs) and its bootstrap interval."""

    metric: str
    """What a step's throughput counts: "tokens/s", "samples/s" or "steps/s"."""
    ratio: float
    """median(B) / median(A) of per-step throughput; > 1: B is faster."""
    low: float
    """Lower end of the interval (the `level` quantiles of the bootstrapped ratios)."""
    high: float
    level: float = 0.95
    steps: tuple[int, int] = (0, 0)
    """Steady-state steps of A and B resampled."""
    a_median: float | None = None
    """A's median per-step throughput (the numerator's and denominator's values, for the table)."""
    b_median: float | None = None

    @property
    def significant(self) -> bool:
        """The interval excludes 1: the runs differ beyond their step-to-step noise."""
        return self.low > 1.0 or self.high < 1.0

    def text(self) -> str:
        """"B/A throughput (samples/s, median per step) = 1.80, 95% interval 1.71-1.90: B is faster"."""
        if self.significant:
            reading = "B is faster" if self.ratio > 1 else "B is slower"
        else:
            reading = "within the noise: no measurable difference"
        return (f"B/A {self.metric} (median per step) = {self.ratio:.2f}, {self.level:.0%} interval "
                f"{self.low:.2f}-{self.high:.2f} ({self.steps[0]} and {self.steps[1]} steps resampled): {reading}")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "steps": list(self.steps), "significant": self.significant}


def step_rates(run: Any) -> tuple[np.ndarray, str]:
    """Per-step throughput of the steady-state steps (warm-up excluded, as the summary does):
    tokens/s when the run counts tokens, else samples/s, else steps/s."""
    t = run.array("t_step")
    keep = np.isfinite(t) & (t > 0) & ~(run.array("warmup") > 0.5)
    for key, metric in (("tokens", "tokens/s"), ("samples", "samples/s")):
        work = run.array(key)
        if keep.any() and np.all(np.isfinite(work[keep])) and np.all(work[keep] > 0):
            return work[keep] / t[keep], metric
    return 1.0 / t[keep], "steps/s"


def bootstrap_ratio(a: np.ndarray, b: np.ndarray, *, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                    seed: int = 0) -> tuple[float, float, float]:
    """(median(b)/median(a), low, high): percentile bootstrap, each sample resampled on its own.
    Steps are treated as independent; a slow drift within a run makes the interval too narrow,
    which the trend finding reports separately."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    rng = np.random.default_rng(seed)
    n = max(200, min(resamples, int(4e6 // max(len(a), len(b), 1))))
    ma = np.median(a[rng.integers(0, len(a), (n, len(a)))], axis=1)
    mb = np.median(b[rng.integers(0, len(b), (n, len(b)))], axis=1)
    ratios = mb / ma
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(np.median(b) / np.median(a)), float(low), float(high)


def loaded_interval(a: Any, b: Any) -> RatioInterval | None:
    """ratio_interval of two LoadedRun (report/load.py), or None without their step records."""
    run_a, run_b = getattr(a, "run", None), getattr(b, "run", None)
    return ratio_interval(run_a, run_b) if run_a is not None and run_b is not None else None


def ratio_interval(run_a: Any, run_b: Any, *, level: float = 0.95) -> RatioInterval | None:
    """The throughput ratio's interval, or None when a run has too few steps (or the two count
    different work: tokens in one, samples in the other, then both fall back to steps/s)."""
    ra, metric_a = step_rates(run_a)
    rb, metric_b = step_rates(run_b)
    if metric_a != metric_b:
        ra, rb, metric_a = _steps_per_s(run_a), _steps_per_s(run_b), "steps/s"
    if len(ra) < MIN_STEPS or len(rb) < MIN_STEPS:
        return None
    value, low, high = bootstrap_ratio(ra, rb, level=level)
    return RatioInterval(metric=metric_a, ratio=value, low=low, high=high, level=level, steps=(len(ra), len(rb)),
                         a_median=float(np.median(ra)), b_median=float(np.median(rb)))


def _steps_per_s(run: Any) -> np.ndarray:
    t = run.array("t_step")
    keep = np.isfinite(t) & (t > 0) & ~(run.array("warmup") > 0.5)
    return 1.0 / t[keep]


def _observations(run: Any, kind: str) -> list[dict[str, Any]]:
    found = [e.get("data") for e in run.events_of("observation")]
    return [d for d in found if isinstance(d, dict) and d.get("kind") == kind]


def model_identity(run: Any) -> dict[str, Any]:
    """{"name", "params"} of the trained model, from what the run recorded: the recipe (engine
    config), the model facts (the Trainer's `model` event, the doctor's observations), or the
    script (a doctor or Monitor run's command)."""
    config = run.config if isinstance(run.config, dict) else {}
    recipe = config.get("recipe") if isinstance(config.get("recipe"), dict) else {}
    # each process of a resumed run records its model again: one of each counts (r1 and its own
    # resumed twin read "different models: 641 parameters, 1,282")
    events = {(str(d.get("class") or d.get("name")), d.get("params")): d
              for e in run.events_of("model") if isinstance(d := e.get("data"), dict)}
    models = list(events.values()) + _observations(run, "model")
    params = sum(int(m.get("params") or 0) for m in models) or None
    classes = sorted({str(m.get("class") or m.get("name")) for m in models if m.get("class") or m.get("name")})
    user_model = config.get("model")  # a Monitor's own config: {"model": {...}} or a name
    name = recipe.get("name") or (str(user_model) if user_model else None) or (", ".join(classes) if classes else None)
    if recipe.get("options"):
        name = f"{name} {recipe['options']}"
    return {"name": name, "params": params}


def data_identity(run: Any) -> dict[str, Any]:
    """{"dataset", "samples"} of the training loader, as recorded (Trainer, Monitor.loader, doctor)."""
    loaders = [o for o in _observations(run, "dataloader") if o.get("role") == "train"] or _observations(run, "dataloader")
    first = loaders[0] if loaders else {}
    return {"dataset": first.get("dataset"), "samples": first.get("dataset_len")}


def device_identity(run: Any) -> dict[str, Any]:
    """{"device", "name"}: the device type the run trained on and its model (GPU or CPU name)."""
    start = next((e.get("data") or {} for e in run.events_of("run_start")), {})
    start = start if isinstance(start, dict) else {}
    device = str(start.get("device") or "cpu").split(":")[0]
    env = run.env if isinstance(run.env, dict) else {}
    if device == "cuda":
        devices = env.get("devices") if isinstance(env.get("devices"), list) else []
        names = sorted({str(d.get("name")) for d in devices if isinstance(d, dict) and d.get("name")})
        name = ", ".join(names) or None
    else:
        cpu = env.get("cpu")
        name = cpu.get("model") if isinstance(cpu, dict) else (str(cpu) if cpu else None)
    return {"device": device, "name": name}


def world_size(run: Any) -> int:
    """Processes that trained: rank 0 plus the ranks whose records the run directory holds."""
    return 1 + len(getattr(run, "rank_steps", None) or {})


def _fmt_model(m: dict[str, Any]) -> str:
    n = m.get("params")
    params = ("parameters unknown" if not n else f"{n:,} parameters" if n < 1e6 else f"{n / 1e6:.3g}M parameters")
    return f"{m.get('name') or 'unnamed model'} ({params})"


def sameness_warnings(run_a: Any, run_b: Any) -> list[str]:
    """One sentence per way the two runs differ in what they measured; a fact either run did
    not record is not compared (no warning from missing data)."""
    out: list[str] = []
    ma, mb = model_identity(run_a), model_identity(run_b)
    if (ma["params"] and mb["params"] and ma["params"] != mb["params"]) or \
            (ma["name"] and mb["name"] and ma["name"] != mb["name"]):
        out.append(f"different models: A {_fmt_model(ma)}, B {_fmt_model(mb)}")
    da, db = data_identity(run_a), data_identity(run_b)
    if any(da[k] is not None and db[k] is not None and da[k] != db[k] for k in da):
        out.append(f"different data: A {da['dataset']} ({da['samples']} samples), B {db['dataset']} ({db['samples']} samples)")
    va, vb = device_identity(run_a), device_identity(run_b)
    if va["device"] != vb["device"] or (va["name"] and vb["name"] and va["name"] != vb["name"]):
        out.append(f"different devices: A {va['device']} ({va['name'] or 'unknown'}), B {vb['device']} ({vb['name'] or 'unknown'})")
    wa, wb = world_size(run_a), world_size(run_b)
    if wa != wb:
        out.append(f"different world sizes: A {wa} process(es), B {wb}: per-process and total throughput differ")
    return out


@dataclass(kw_only=True, slots=True)
class Comparability:
    """What a comparison of two runs can claim: its noise interval and how the runs differ."""

    interval: RatioInterval | None = None
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"Warning: A and B differ: {w}; the ratios below compare unlike runs" for w in self.warnings]
        out.append(self.interval.text() if self.interval is not None else
                   f"no noise interval: a run has fewer than {MIN_STEPS} steady-state steps")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"interval": self.interval.as_dict() if self.interval else None, "warnings": list(self.warnings)}


def comparability(run_a: Any, run_b: Any) -> Comparability:
    """The interval of the throughput ratio and the sameness warnings of two RunData."""
    return Comparability(interval=ratio_interval(run_a, run_b), warnings=sameness_warnings(run_a, run_b))
