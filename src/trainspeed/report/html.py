"""Self-contained HTML report: one file, works offline (inline CSS and SVG, no scripts, no
external assets), so it can be attached to an issue or opened from a CI artifact.

The markup is in report/templates/ (Jinja2, every value escaped unless it is Markup); this
module reads a run into the values the templates show.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from markupsafe import Markup

from trainspeed.report.compare import compare_rows, fmt_value, headline, loaded_interval
from trainspeed.report.fmt import fmt_ms, fmt_share, is_num, mfu_text, rank_findings
from trainspeed.report.load import LoadedRun, from_run
from trainspeed.report.plots import Series, render_plots
from trainspeed.report.templating import render
from trainspeed.report.terminal import phase_rows, summary_lines
from trainspeed.telemetry.stakes import stake_text


def _phases(summary: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(phase, mean ms, share, bar width %) per phase, largest share first."""
    return [(name, fmt_ms(mean), fmt_share(share), f"{100 * max(0.0, min(1.0, share or 0.0)):.1f}")
            for name, mean, share in phase_rows(summary)]


def _findings(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings in the doctor's order, each with its severity's CSS class and its lines."""
    out = []
    for f in rank_findings(findings):
        sev = str(f.get("severity", "info"))
        impact = f.get("impact")
        lines = [(label, f[key], key == "verify_with")
                 for key, label in (("evidence", "Evidence"), ("recommendation", "Do"),
                                    ("verify_with", "Verify with"), ("tuned", "Tuned")) if f.get(key)]
        out.append({"css": sev if sev in ("critical", "warning", "info") else "info", "id": f.get("id", ""),
                    "severity": sev, "title": f.get("title") or f.get("id") or "finding",
                    "stake": f" · {stake_text(f)}" if is_num(impact) and stake_text(f) else "", "lines": lines})
    return out


def _plots(runs: list[Series]) -> list[tuple[str, str, Markup | None]]:
    # The SVG is deliberately HTML and safe to inline: matplotlib wrote it from numbers, with
    # its own XML escaping of every text label (run names in legends included).
    return [(name, title, Markup(svg) if svg else None) for name, title, svg in render_plots(runs)]


def _notes(loaded: list[LoadedRun]) -> list[str]:
    items = []
    for lr in loaded:
        prefix = f"{lr.name}: " if len(loaded) > 1 else ""
        items += [prefix + note for note in (lr.run.skipped or [])]
        if lr.summary_source != "report.json" and lr.summary_source != "given":
            items.append(f"{prefix}summary {lr.summary_source} (report.json had none).")
    return items


def _run(lr: LoadedRun) -> dict[str, Any]:
    """A run's name, findings, traceback, config and environment, as its sections show them."""
    import yaml

    return {"name": lr.name, "findings": _findings(lr.findings), "traceback": lr.traceback,
            "config": yaml.safe_dump(lr.run.config or {}, sort_keys=False) if lr.run.config else "(no config.yaml)",
            "env": json.dumps(lr.run.env, indent=2, default=str) if lr.run.env else "(no env.json)"}


def _compare_rows(a: LoadedRun, b: LoadedRun) -> tuple[str, list[dict[str, Any]]]:
    interval = loaded_interval(a, b)
    rows = compare_rows(a.summary, b.summary, interval)
    out = []
    for r in rows:
        css = "better" if ("faster" in r["verdict"] or "less" in r["verdict"]) else \
            "worse" if ("slower" in r["verdict"] or "more" in r["verdict"]) else ""
        out.append({"group": r["group"], "metric": r["metric"], "a": fmt_value(r["a"], r["kind"]),
                    "b": fmt_value(r["b"], r["kind"]), "verdict": r["verdict"], "css": css,
                    "ratio": f"{r['ratio']:.2f}" if r["ratio"] is not None else "—"})
    return headline(rows, interval), out


def _generated() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def write_html(run: Any, path: str | Path, *, summary: dict[str, Any], findings: list[dict[str, Any]],
               compare: Any = None) -> Path:
    """Write the report for `run` (RunData) to `path`; with `compare` (a LoadedRun, or a RunData
    whose summary is read/computed), write the A-vs-B comparison with overlaid plots instead.

    Needs matplotlib (the `report` extra); raises MissingDependencyError without it.
    """
    a = from_run(run, summary=summary, findings=findings)
    if compare is not None:
        b = compare if isinstance(compare, LoadedRun) else from_run(compare)
        text = _compare_page(a, b)
    else:
        text = _single_page(a, Path(path).parent)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)  # atomic: a reader never sees half a report
    except BaseException:
        # one cut short by a full disk leaves no temp file (an empty .report.html.tmp stayed in
        # the doctor's full run directory)
        tmp.unlink(missing_ok=True)
        raise
    return out


def _traces(a: LoadedRun, page_dir: Path) -> list[tuple[str, str, str, bool]]:
    from trainspeed.report.traces import profile_traces

    return [(t.href(page_dir), t.path.name, t.steps, t.exists) for t in profile_traces(a.run)]


def _single_page(a: LoadedRun, page_dir: Path | None = None) -> str:
    from trainspeed.report.ranks import HEADERS, rank_rows
    from trainspeed.report.traces import VIEWER_HINT

    return render("report.html.j2", title=f"trainspeed report: {a.name}",
                  subtitle=f"{a.kind or 'run'} · {a.run.path} · generated {_generated()}",
                  summary=summary_lines(a.summary), phases=_phases(a.summary), rank_headers=HEADERS,
                  ranks=rank_rows(a.summary), findings=_findings(a.findings),
                  traces=_traces(a, page_dir if page_dir is not None else Path(a.run.path)), viewer_hint=VIEWER_HINT,
                  plots=_plots([Series(label=a.name, run=a.run, summary=a.summary)]), notes=_notes([a]), run=_run(a))


def _compare_page(a: LoadedRun, b: LoadedRun) -> str:
    runs = [Series(label=f"A: {a.name}", run=a.run, summary=a.summary),
            Series(label=f"B: {b.name}", run=b.run, summary=b.summary)]
    head, rows = _compare_rows(a, b)
    return render("compare.html.j2", title=f"trainspeed compare: {a.name} vs {b.name}",
                  subtitle=f"A = {a.run.path} · B = {b.run.path} · generated {_generated()}",
                  headline=head, mfu_a=mfu_text(a.summary.get("mfu")), mfu_b=mfu_text(b.summary.get("mfu")),
                  rows=rows, plots=_plots(runs), a=_run(a), b=_run(b), notes=_notes([a, b]))
