"""Self-contained HTML report: one file, works offline (inline CSS and SVG, no scripts, no
external assets), so it can be attached to an issue or opened from a CI artifact."""

from __future__ import annotations

import html as H
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainspeed.report.compare import compare_rows, fmt_value, headline, loaded_interval
from trainspeed.report.fmt import fmt_ms, fmt_share, is_num, mfu_text, rank_findings
from trainspeed.report.load import LoadedRun, from_run
from trainspeed.report.plots import Series, render_plots
from trainspeed.report.terminal import phase_rows, summary_lines
from trainspeed.telemetry.stakes import stake_text

CSS = """
:root { --fg:#1f2328; --muted:#59636e; --line:#d1d9e0; --bg:#ffffff; --card:#f6f8fa;
        --crit:#d1242f; --warn:#9a6700; --info:#0969da; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
       font: 15px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; }
main { max-width: 980px; margin: 0 auto; padding: 24px 20px 60px; }
h1 { font-size: 26px; margin: 0 0 4px; } h2 { font-size: 19px; margin: 32px 0 10px;
     border-bottom: 1px solid var(--line); padding-bottom: 4px; }
.sub, .note, figcaption { color: var(--muted); font-size: 13px; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { text-align: left; padding: 5px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
td.num, th.num { text-align: right; white-space: nowrap; } td.verdict { white-space: nowrap; }
table.kv th { width: 160px; color: var(--muted); font-weight: 600; }
.bar { background: #e8ebef; height: 10px; width: 220px; border-radius: 3px; overflow: hidden; }
.bar > span { display: block; height: 100%; background: #4e79a7; }
.finding { border: 1px solid var(--line); border-left: 5px solid var(--info); border-radius: 6px;
           padding: 10px 14px; margin: 10px 0; background: var(--card); }
.finding.critical { border-left-color: var(--crit); } .finding.warning { border-left-color: var(--warn); }
.finding h3 { margin: 0 0 4px; font-size: 16px; }
.sev { font-size: 11px; font-weight: 700; text-transform: uppercase; letter-spacing: .04em; margin-right: 6px; }
.critical .sev { color: var(--crit); } .warning .sev { color: var(--warn); } .info .sev { color: var(--info); }
.finding p { margin: 4px 0; } .label { font-weight: 600; }
figure.plot { margin: 18px 0; } figure.plot svg { width: 100%; height: auto; display: block; }
figure.plot figcaption { font-weight: 600; color: var(--fg); font-size: 14px; margin-bottom: 4px; }
p.nodata { border: 1px dashed var(--line); padding: 10px; color: var(--muted); font-size: 13px; margin: 0; }
pre { background: var(--card); padding: 12px; overflow-x: auto; font-size: 12.5px; border-radius: 6px; }
details { margin: 8px 0; } summary { cursor: pointer; font-weight: 600; }
.notes li { color: var(--warn); } .headline { font-size: 17px; font-weight: 600; }
.better { color: #1a7f37; font-weight: 600; } .worse { color: var(--crit); font-weight: 600; }
"""


def _e(x: Any) -> str:
    return H.escape(str(x), quote=True)


def _kv_table(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _phase_table(summary: dict[str, Any]) -> str:
    rows = phase_rows(summary)
    if not rows:
        return '<p class="note">No phase times recorded.</p>'
    body = "".join(
        f"<tr><td>{_e(name)}</td><td class='num'>{_e(fmt_ms(mean))}</td><td class='num'>{_e(fmt_share(share))}</td>"
        f"<td><div class='bar'><span style='width:{100 * max(0.0, min(1.0, share or 0.0)):.1f}%'></span></div></td></tr>"
        for name, mean, share in rows
    )
    return ("<table><thead><tr><th>phase</th><th class='num'>mean ms</th><th class='num'>share</th><th></th>"
            f"</tr></thead><tbody>{body}</tbody></table>")


def _rank_table(summary: dict[str, Any]) -> str:
    from trainspeed.report.ranks import HEADERS, rank_rows

    rows = rank_rows(summary)
    if not rows:
        return ""
    head = "".join(f"<th>{_e(h)}</th>" for h in HEADERS)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return (f"<section id='ranks'><h2>Per rank (data parallel)</h2><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></section>")


def _findings(findings: list[dict[str, Any]]) -> str:
    ranked = rank_findings(findings)
    if not ranked:
        return '<p class="note">No findings.</p>'
    out = []
    for f in ranked:
        sev = str(f.get("severity", "info"))
        sev_cls = sev if sev in ("critical", "warning", "info") else "info"
        impact = f.get("impact")
        impact_txt = f" · {stake_text(f)}" if is_num(impact) and stake_text(f) else ""
        parts = [f'<div class="finding {sev_cls}" data-finding="{_e(f.get("id", ""))}">',
                 f'<h3><span class="sev">{_e(sev)}</span>{_e(f.get("title") or f.get("id") or "finding")}'
                 f'<span class="note">{_e(impact_txt)}</span></h3>']
        for key, label in (("evidence", "Evidence"), ("recommendation", "Do"), ("verify_with", "Verify with"),
                           ("tuned", "Tuned")):
            if f.get(key):
                value = f"<code>{_e(f[key])}</code>" if key == "verify_with" else _e(f[key])
                parts.append(f'<p><span class="label">{label}:</span> {value}</p>')
        parts.append("</div>")
        out.append("".join(parts))
    return "".join(out)


def _plots(runs: list[Series]) -> str:
    out = []
    for name, title, svg in render_plots(runs):
        inner = svg if svg else '<p class="nodata">no data: this run recorded nothing for this plot.</p>'
        out.append(f'<figure class="plot" data-plot="{name}"><figcaption>{_e(title)}</figcaption>{inner}</figure>')
    return "".join(out)


def _notes(loaded: list[LoadedRun]) -> str:
    items = []
    for lr in loaded:
        prefix = f"{lr.name}: " if len(loaded) > 1 else ""
        items += [f"<li>{_e(prefix + note)}</li>" for note in (lr.run.skipped or [])]
        if lr.summary_source != "report.json" and lr.summary_source != "given":
            items.append(f"<li>{_e(prefix)}summary {_e(lr.summary_source)} (report.json had none).</li>")
    if not items:
        return ""
    return ("<h2>Notes</h2><p class='note'>Unreadable records were skipped; everything else is shown.</p>"
            f"<ul class='notes'>{''.join(items)}</ul>")


def _details(lr: LoadedRun) -> str:
    import yaml

    config = yaml.safe_dump(lr.run.config or {}, sort_keys=False) if lr.run.config else "(no config.yaml)"
    env = json.dumps(lr.run.env, indent=2, default=str) if lr.run.env else "(no env.json)"
    tb = f"<details open><summary>Traceback (the run crashed)</summary><pre>{_e(lr.traceback)}</pre></details>" \
        if lr.traceback else ""
    label = f" of {lr.name}"
    return (f"{tb}<details><summary>Config{_e(label)} (config.yaml)</summary><pre>{_e(config)}</pre></details>"
            f"<details><summary>Environment{_e(label)} (env.json)</summary><pre>{_e(env)}</pre></details>")


def _compare_table(a: LoadedRun, b: LoadedRun) -> str:
    interval = loaded_interval(a, b)
    rows = compare_rows(a.summary, b.summary, interval)
    head = headline(rows, interval)
    body = []
    for r in rows:
        cls = "better" if ("faster" in r["verdict"] or "less" in r["verdict"]) else \
            "worse" if ("slower" in r["verdict"] or "more" in r["verdict"]) else ""
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "—"
        body.append(f"<tr><td>{_e(r['group'])}</td><td>{_e(r['metric'])}</td>"
                    f"<td class='num'>{_e(fmt_value(r['a'], r['kind']))}</td>"
                    f"<td class='num'>{_e(fmt_value(r['b'], r['kind']))}</td><td class='num'>{ratio}</td>"
                    f"<td class='verdict {cls}'>{_e(r['verdict'])}</td></tr>")
    mfu = (f"<p id='compare-mfu'><span class='label'>MFU:</span> A {_e(mfu_text(a.summary.get('mfu')))}; "
           f"B {_e(mfu_text(b.summary.get('mfu')))}</p>")
    return ((f"<p class='headline'>{_e(head)}</p>" if head else "") + mfu
            + f"<table id='compare-table'><thead><tr><th></th><th>metric</th><th class='num'>A: {_e(a.name)}</th>"
              f"<th class='num'>B: {_e(b.name)}</th><th class='num'>B/A</th><th>reading</th></tr></thead>"
              f"<tbody>{''.join(body)}</tbody></table>")


def _page(title: str, subtitle: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        # An empty inline icon: otherwise the browser asks the file system for /favicon.ico.
        "<link rel='icon' href='data:,'>"
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body><main>"
        f"<header><h1>{_e(title)}</h1><p class='sub'>{_e(subtitle)}</p></header>{body}</main></body></html>\n"
    )


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
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)  # atomic: a reader never sees half a report
    return out


def _traces(a: LoadedRun, page_dir: Path) -> str:
    from trainspeed.report.traces import VIEWER_HINT, profile_traces

    items = [f"<li><a href='{_e(t.href(page_dir))}'>{_e(t.path.name)}</a> — steps {_e(t.steps)}"
             f"{'' if t.exists else ' (missing)'}</li>" for t in profile_traces(a.run)]
    if not items:
        return ""
    return (f"<section id='profile'><h2>Profiler traces</h2><ul>{''.join(items)}</ul>"
            f"<p class='note'>torch.profiler traces with trainspeed.&lt;phase&gt; ranges; {_e(VIEWER_HINT)}.</p></section>")


def _single_page(a: LoadedRun, page_dir: Path | None = None) -> str:
    body = (
        f"<section id='summary'><h2>Summary</h2>{_kv_table(summary_lines(a.summary))}</section>"
        f"<section id='phases'><h2>Where the step time goes</h2>{_phase_table(a.summary)}</section>"
        f"{_rank_table(a.summary)}"
        f"<section id='findings'><h2>Findings</h2>{_findings(a.findings)}</section>"
        f"{_traces(a, page_dir if page_dir is not None else Path(a.run.path))}"
        f"<section id='plots'><h2>Plots</h2>{_plots([Series(label=a.name, run=a.run, summary=a.summary)])}</section>"
        f"<section id='notes'>{_notes([a])}</section>"
        f"<section id='details'><h2>Details</h2>{_details(a)}</section>"
    )
    kind = a.kind or "run"
    return _page(f"trainspeed report: {a.name}", f"{kind} · {a.run.path} · generated {_generated()}", body)


def _compare_page(a: LoadedRun, b: LoadedRun) -> str:
    runs = [Series(label=f"A: {a.name}", run=a.run, summary=a.summary),
            Series(label=f"B: {b.name}", run=b.run, summary=b.summary)]
    body = (
        f"<section id='compare'><h2>A vs B</h2>{_compare_table(a, b)}</section>"
        f"<section id='plots'><h2>Plots (A and B overlaid)</h2>{_plots(runs)}</section>"
        f"<section id='findings'><h2>Findings for A: {_e(a.name)}</h2>{_findings(a.findings)}"
        f"<h2>Findings for B: {_e(b.name)}</h2>{_findings(b.findings)}</section>"
        f"<section id='notes'>{_notes([a, b])}</section>"
        f"<section id='details'><h2>Details</h2>{_details(a)}{_details(b)}</section>"
    )
    return _page(f"trainspeed compare: {a.name} vs {b.name}",
                 f"A = {a.run.path} · B = {b.run.path} · generated {_generated()}", body)

