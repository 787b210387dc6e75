"""Report plots: matplotlib (Agg, no pyplot state) figures rendered to inline SVG strings.

Each plot function takes a list of `Series` (one per run: one for a report, two overlaid for
a comparison) and returns an SVG string, or None when no run has data for it, so the page can
say "no data" instead of drawing empty axes.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from trainspeed.errors import require
from trainspeed.report import series as S
from trainspeed.telemetry.schema import PHASES
from trainspeed.telemetry.update_losses import update_losses

# Raw per-step lines above this many points are drawn as a per-bin min-max band instead:
# keeps the SVG small (a 100k-step run would otherwise embed 100k vertices per line).
MAX_RAW_POINTS = 2000
RUN_COLORS = ("#1f6feb", "#d1242f")
RUN_STYLES = ("-", "--")  # B dashed, so identical curves stay visible when overlaid
PHASE_COLORS = {
    "data": "#e15759", "h2d": "#f28e2b", "forward": "#4e79a7", "backward": "#76b7b2",
    "optimizer": "#59a14f", "log": "#edc948", "ckpt": "#b07aa1", "eval": "#ff9da7", "other": "#bab0ac",
}


@dataclass(kw_only=True, slots=True)
class Series:
    """One run as the plots see it."""

    label: str
    """Legend label (the run's name)."""
    run: Any
    """RunData (anything with `.steps`)."""
    summary: dict[str, Any]
    """The run's summary (trend, phases)."""


def _mpl() -> Any:
    mpl = require("matplotlib", extra="report", feature="HTML reports")
    from matplotlib.figure import Figure  # Figure without pyplot: no global state, no GUI backend

    return mpl, Figure


_ID_RE = re.compile(r'(\bid="|url\(#|href="#)')


def _to_svg(fig: Any, prefix: str) -> str:
    """Serialize a figure to an <svg> element whose ids are unique within the page."""
    mpl, _ = _mpl()
    buf = io.StringIO()
    with mpl.rc_context({"svg.fonttype": "path", "svg.hashsalt": prefix}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # drop the XML declaration and DOCTYPE: invalid inside HTML
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    # Several SVGs inline in one document share one id namespace; prefix ids and references.
    return _ID_RE.sub(lambda m: m.group(1) + prefix + "-", text)


def _eng() -> Any:
    from matplotlib.ticker import EngFormatter

    return EngFormatter(sep="")  # 150000 -> "150k"


def _figure(height: float = 3.0) -> tuple[Any, Any]:
    _, Figure = _mpl()
    fig = Figure(figsize=(9.0, height), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.3, linewidth=0.6)
    ax.spines[["top", "right"]].set_visible(False)
    return fig, ax


def _line(ax: Any, x: np.ndarray, y: np.ndarray, *, color: str, label: str, raw: bool, ls: str = "-") -> None:
    """Plot a per-step line, or its per-bin min-max band when there are too many points."""
    ok = np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) <= MAX_RAW_POINTS:
        ax.plot(x, y, color=color, alpha=0.35 if raw else 1.0, linewidth=0.8 if raw else 1.6,
                label=label, marker="o" if len(x) < 40 and not raw else None, markersize=3, linestyle=ls)
        return
    slices = S.bin_slices(len(x), MAX_RAW_POINTS // 2)
    cx = np.array([x[s].mean() for s in slices])
    lo = np.array([y[s].min() for s in slices])
    hi = np.array([y[s].max() for s in slices])
    if raw:
        ax.fill_between(cx, lo, hi, color=color, alpha=0.25, linewidth=0, label=label)
    else:
        ax.plot(cx, np.array([y[s].mean() for s in slices]), color=color, linewidth=1.6, label=label, linestyle=ls)


def _legend_above(ax: Any, ncols: int = 3) -> None:
    """Legend in a row above the axes, so it never hides data."""
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=8, ncols=ncols, frameon=False)


def plot_step_time(runs: list[Series], prefix: str) -> str | None:
    if not any(S.has_data(S.column(s.run, "t_step")) for s in runs):
        return None
    fig, ax = _figure(3.4)
    for i, s in enumerate(runs):
        x, y = S.step_axis(s.run), S.column(s.run, "t_step") * 1e3
        if not S.has_data(y):
            continue
        color = RUN_COLORS[i % 2]
        name = f"{s.label}: " if len(runs) > 1 else ""
        _line(ax, x, y, color=color, label=f"{name}step time", raw=True)
        med = S.rolling_median(y, S.default_window(len(y)))
        _line(ax, x, med, color=color, label=f"{name}rolling median", raw=False)
        warm = np.array([bool(r.get("warmup")) for r in s.run.steps])
        if warm.any() and len(runs) == 1:
            ax.axvspan(x[warm].min(), x[warm].max(), color="#999999", alpha=0.15, label="warm-up (excluded)")
        trend = (s.summary or {}).get("trend")
        if isinstance(trend, dict) and trend.get("since_step") is not None:
            since = trend["since_step"]
            phase = trend.get("phase")
            ty = S.column(s.run, f"phases.{phase}") * 1e3 if phase in PHASES else y
            fit = S.trend_line(x, ty, since)
            ax.axvline(float(since), color=color, linestyle="--", linewidth=1.0,
                       label=f"{name}change point (step {since})")
            if phase in PHASES:  # the trend is in one phase: show that phase so its line has context
                ax.plot(x, S.rolling_median(ty, S.default_window(len(ty))), color=PHASE_COLORS[phase],
                        linewidth=1.2, label=f"{name}{phase} phase (rolling median)")
            if fit is not None:
                what = f"{phase} " if phase in PHASES else ""
                ax.plot(fit[0], fit[1], color="#222222" if len(runs) == 1 else color, linestyle=":",
                        linewidth=2.0, label=f"{name}{what}trend")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.set_ylim(bottom=0)
    scale = steady_scale(runs)
    if scale is not None:
        top, (step, ms) = scale
        ax.set_ylim(0, top)
        ax.annotate(f"warm-up step {step}: {ms:,.0f} ms (off the scale)", xy=(step, top), xytext=(4, -12),
                    textcoords="offset points", fontsize=8, color="#555555", va="top")
    _legend_above(ax)
    return _to_svg(fig, prefix)


def steady_scale(runs: list[Series]) -> tuple[float, tuple[int, float]] | None:
    """(y top in ms, (step, ms) of the slowest warm-up step) when warm-up steps would set the
    step-time scale: a first step of seconds (imports, compile, allocator) against steady steps
    of milliseconds left the steady line flat at zero. None when the steady steps set it."""
    top, worst = 0.0, None
    for s in runs:
        y = S.column(s.run, "t_step") * 1e3
        if not S.has_data(y):
            continue
        warm = np.array([bool(r.get("warmup")) for r in s.run.steps])
        ok = np.isfinite(y)
        steady = y[ok & ~warm]
        if len(steady):
            top = max(top, float(steady.max()))
        x = S.step_axis(s.run)
        for i in np.flatnonzero(ok & warm):
            if worst is None or y[i] > worst[1]:
                worst = (int(x[i]), float(y[i]))
    if top <= 0 or worst is None or worst[1] <= 1.15 * top:
        return None
    return 1.15 * top, worst


def plot_phases(runs: list[Series], prefix: str) -> str | None:
    """One run: mean phase time per bin of steps, stacked. Compare: one stacked bar per run."""
    if len(runs) == 1:
        centers, means = S.phase_bins(runs[0].run)
        if not means:
            return None
        fig, ax = _figure(3.4)
        names = [p for p in PHASES if p in means]
        ax.stackplot(centers, *[means[p] * 1e3 for p in names], labels=names,
                     colors=[PHASE_COLORS[p] for p in names], alpha=0.9)
        ax.set_xlabel("step")
        ax.set_ylabel("mean time per step (ms)")
        _legend_above(ax, ncols=len(names))
        return _to_svg(fig, prefix)
    rows = []
    for s in runs:
        _, means = S.phase_bins(s.run, max_bins=1)
        rows.append({p: float(v[0]) for p, v in means.items()})
    if not any(rows):
        return None
    fig, ax = _figure(1.2 + 0.6 * len(runs))
    names = [p for p in PHASES if any(p in r for r in rows)]
    left = np.zeros(len(runs))
    labels = [s.label for s in runs]
    for p in names:
        widths = np.array([r.get(p, 0.0) * 1e3 for r in rows])
        ax.barh(labels, widths, left=left, color=PHASE_COLORS[p], label=p)
        left += widths
    ax.invert_yaxis()
    ax.set_xlabel("mean time per step (ms)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, ncols=len(names), frameon=False)
    return _to_svg(fig, prefix)


def plot_throughput(runs: list[Series], prefix: str) -> str | None:
    data = [S.throughput_series(s.run) for s in runs]
    if not any(len(d[0]) for d in data):
        return None
    fig, ax = _figure()
    units = {d[2] for d in data if len(d[0])}
    for i, (s, (x, rate, unit)) in enumerate(zip(runs, data)):
        if len(x):
            ax.plot(x, rate, color=RUN_COLORS[i % 2], linewidth=1.6, label=s.label if len(runs) > 1 else unit,
                    marker="o" if len(x) < 40 else None, markersize=3, linestyle=RUN_STYLES[i % 2])
    ax.set_xlabel("step")
    ax.set_ylabel(" / ".join(sorted(units)))
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(_eng())
    if len(runs) > 1:
        _legend_above(ax)
    return _to_svg(fig, prefix)


def plot_memory(runs: list[Series], prefix: str) -> str | None:
    cols = [[(label, S.first_column(s.run, keys)) for label, keys in S.MEMORY_FIELDS] for s in runs]
    present = [[(label, y) for label, y in c if S.has_data(y)] for c in cols]
    if not any(present):
        return None
    peak = max(float(np.nanmax(y)) for p in present for _, y in p)
    scale, unit = (2**30, "GiB") if peak >= 2 * 2**30 else (2**20, "MiB")
    fig, ax = _figure()
    styles = ("-", "--", "-.", ":")
    for i, (s, p) in enumerate(zip(runs, present)):
        x = S.step_axis(s.run)
        for j, (label, y) in enumerate(p):
            name = f"{s.label}: {label}" if len(runs) > 1 else label
            color = RUN_COLORS[i % 2] if len(runs) > 1 else list(PHASE_COLORS.values())[j * 2]
            _line(ax, x, y / scale, color=color, label=name, raw=False, ls=styles[j % 4])
    ax.set_xlabel("step")
    ax.set_ylabel(f"memory ({unit})")
    ax.set_ylim(bottom=0)
    _legend_above(ax, ncols=2 if len(runs) > 1 else 4)
    return _to_svg(fig, prefix)


def _simple(key: str, ylabel: str, scale: float = 1.0) -> Callable[[list[Series], str], str | None]:
    def plot(runs: list[Series], prefix: str) -> str | None:
        if not any(S.has_data(S.column(s.run, key)) for s in runs):
            return None
        fig, ax = _figure()
        for i, s in enumerate(runs):
            y = S.column(s.run, key) * scale
            if S.has_data(y):
                _line(ax, S.step_axis(s.run), y, color=RUN_COLORS[i % 2], label=s.label, raw=False,
                      ls=RUN_STYLES[i % 2])
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if len(runs) > 1:
            _legend_above(ax)
        return _to_svg(fig, prefix)

    return plot


_plot_one_loss = _simple("loss", "loss")
LOSS_STYLES = ("-", "--", "-.", ":")


def plot_loss(runs: list[Series], prefix: str) -> str | None:
    """The loss curve; a run that stepped several optimizers (a GAN's D and G) draws each
    one's own loss, named as the script names the optimizer, never their blend."""
    named = [update_losses(s.run) for s in runs]
    if not any(named):
        return _plot_one_loss(runs, prefix)
    fig, ax = _figure()
    for i, (s, losses) in enumerate(zip(runs, named)):
        series = losses or {"loss": S.column(s.run, "loss")}
        for j, (name, y) in enumerate(series.items()):
            if not S.has_data(y):
                continue
            label = f"{s.label}: {name}" if len(runs) > 1 else name
            color = RUN_COLORS[i % 2] if len(runs) > 1 else list(PHASE_COLORS.values())[(2 * j) % len(PHASE_COLORS)]
            _line(ax, S.step_axis(s.run), y, color=color, label=label, raw=False, ls=LOSS_STYLES[j % 4])
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    _legend_above(ax, ncols=4)
    return _to_svg(fig, prefix)


plot_padding = _simple("pad_share", "padding share (% of tokens)", 100.0)

# (name, title, function): the order the HTML report shows them in.
PLOTS: tuple[tuple[str, str, Callable[[list[Series], str], str | None]], ...] = (
    ("step_time", "Step time", plot_step_time),
    ("phases", "Phase breakdown", plot_phases),
    ("throughput", "Throughput", plot_throughput),
    ("memory", "Memory", plot_memory),
    ("loss", "Loss", plot_loss),
    ("padding", "Padding share", plot_padding),
)


def render_plots(runs: list[Series]) -> list[tuple[str, str, str | None]]:
    """[(name, title, svg or None)] for every plot in PLOTS."""
    return [(name, title, fn(runs, f"p{i}")) for i, (name, title, fn) in enumerate(PLOTS)]
