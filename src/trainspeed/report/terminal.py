"""Terminal report (rich): summary, phase breakdown, ranked findings, skipped-line notes.

rich writes plain text (no ANSI escapes) when the console is not a terminal, so the same
function serves an interactive shell, a CI log and a pipe.
"""

from __future__ import annotations

from typing import Any

from trainspeed.report.compare import compare_rows, fmt_value, headline, loaded_interval
from trainspeed.report.fmt import (
    fmt_bytes,
    fmt_ms,
    fmt_rate,
    fmt_seconds,
    fmt_share,
    is_num,
    mfu_text,
    rank_findings,
)
from trainspeed.telemetry.schema import PHASES
from trainspeed.telemetry.stakes import stake_text

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
MAX_NOTES = 20


def _console(console: Any = None) -> Any:
    if console is not None:
        return console
    from trainspeed.rich_console import new_console

    return new_console()  # the terminal's width, or a log's (rich_console.py)


def _loss_rows(losses: dict[str, Any]) -> list[tuple[str, str]]:
    """One summary row per optimizer's loss ("loss optimizerD", "loss optimizerG")."""
    rows = []
    for name, fig in losses.items():
        fig = fig if isinstance(fig, dict) else {}
        text = (f"{fig['first']:.4g} → {fig['last']:.4g} (min {fig['min']:.4g})"
                if all(is_num(fig.get(k)) for k in ("first", "last", "min")) else "no finite value")
        if is_num(fig.get("nonfinite")) and fig["nonfinite"]:
            text += f" · {int(fig['nonfinite'])} non-finite (NaN/Inf)"
        rows.append((f"loss {name}", text))
    return rows


def summary_lines(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) pairs for the summary block; shared by terminal and HTML."""
    s = summary or {}
    rows: list[tuple[str, str]] = []
    steps, measured = s.get("steps"), s.get("measured_steps")
    rows.append(("steps", f"{steps if steps is not None else '—'} ({measured if measured is not None else '—'} measured, "
                          "warm-up excluded)"))
    rate = fmt_rate(s.get("samples_per_s"), "samples/s")
    if is_num(s.get("tokens_per_s")):
        rate += f" · {fmt_rate(s.get('tokens_per_s'), 'tokens/s')}"
    rows.append(("throughput", rate))
    st = s.get("step_time") or {}
    rows.append(("step time", f"p50 {fmt_seconds(st.get('p50'))} · p90 {fmt_seconds(st.get('p90'))} · "
                              f"p99 {fmt_seconds(st.get('p99'))}"))
    rows.append(("MFU", mfu_text(s.get("mfu"))))
    busy = s.get("gpu_busy")
    if isinstance(busy, dict):  # NVML over the measured steps only (telemetry/gpu_busy.py)
        rows.append(("GPU busy", f"{fmt_share(busy.get('value'))} ({busy.get('basis')})" if busy.get("valid")
                     else f"not measured ({busy.get('note') or busy.get('basis')})"))
    mem = s.get("memory") or {}
    parts = []
    for key, label in (("cuda_alloc_peak", "device alloc"), ("cuda_reserved_peak", "device reserved"),
                       ("rss_peak", "host RSS"), ("worker_rss_peak", "workers RSS")):
        if is_num(mem.get(key)):
            parts.append(f"{label} {fmt_bytes(mem[key])}")
    rows.append(("memory peaks", " · ".join(parts) if parts else "not measured"))
    losses = s.get("losses")
    if isinstance(losses, dict) and losses:  # several optimizers: each one's own loss, never a blend
        rows.extend(_loss_rows(losses))
    else:
        loss = s.get("loss")
        if isinstance(loss, dict) and is_num(loss.get("last")):
            rows.append(("loss", f"{loss.get('first'):.4g} → {loss.get('last'):.4g} (min {loss.get('min'):.4g})"))
    if is_num(s.get("pad_share")):
        rows.append(("padding", f"{fmt_share(s['pad_share'])} of tokens are padding"))
    if is_num(s.get("syncs_per_step")) and s["syncs_per_step"] > 0:
        rows.append(("host syncs", f"{s['syncs_per_step']:.2g} per step"))
    trend = s.get("trend")
    if isinstance(trend, dict) and trend.get("message"):
        rows.append(("trend", str(trend["message"])))
    if is_num(s.get("dropped_records")) and s["dropped_records"] > 0:
        rows.append(("dropped records", f"{int(s['dropped_records'])} (the writer queue was full)"))
    if is_num(s.get("thinned_records")) and s["thinned_records"] > 0:
        rows.append(("dashboards", f"{int(s['thinned_records'])} step records skipped to keep up "
                                   "(steps.jsonl is complete)"))
    ranks = s.get("ranks")
    if isinstance(ranks, list) and len(ranks) > 1:
        rows.append(("data parallel", f"{len(ranks)} ranks; throughput above is rank 0's "
                                      f"(the job's is about {len(ranks)}x)"))
    rows.append(("device", f"{s.get('device') or '—'} · {s.get('precision') or '—'}"))
    return rows


def phase_rows(summary: dict[str, Any]) -> list[tuple[str, float | None, float | None]]:
    """(phase, mean seconds, share) for phases with time, largest share first; a phase the
    doctor labelled is shown by its label (an RL rollout's "eval": doctor/checks/rollout.py)."""
    phases = (summary or {}).get("phases") or {}
    rows = []
    for name in PHASES:
        p = phases.get(name) or {}
        mean, share = p.get("mean_s"), p.get("share")
        if (is_num(mean) and mean > 0) or (is_num(share) and share > 0):
            rows.append((str(p.get("label") or name), mean if is_num(mean) else None, share if is_num(share) else None))
    rows.sort(key=lambda r: -(r[2] if r[2] is not None else (r[1] or 0.0)))
    return rows


def _bar(share: float | None, width: int = 20) -> str:
    if share is None:
        return ""
    n = int(round(max(0.0, min(1.0, share)) * width))
    return "█" * n + "·" * (width - n)


def _print_summary(con: Any, summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for label, value in summary_lines(summary):
        table.add_row(label, value)
    con.print(table)


def _print_phases(con: Any, summary: dict[str, Any]) -> None:
    from rich.table import Table

    rows = phase_rows(summary)
    if not rows:
        con.print("Phase breakdown: no phase times recorded.")
        return
    table = Table(title="Where the step time goes", title_justify="left")
    table.add_column("phase")
    table.add_column("mean ms", justify="right")
    table.add_column("share", justify="right")
    table.add_column("")
    for name, mean, share in rows:
        table.add_row(name, fmt_ms(mean), fmt_share(share), _bar(share))
    con.print(table)


def _print_ranks(con: Any, summary: dict[str, Any]) -> None:
    from rich.table import Table

    from trainspeed.report.ranks import HEADERS, rank_rows

    rows = rank_rows(summary)
    if not rows:
        return
    table = Table(title="Per rank (data parallel)", title_justify="left")
    for i, h in enumerate(HEADERS):
        table.add_column(h, justify="right" if 0 < i < len(HEADERS) - 1 else "left")
    for row in rows:
        table.add_row(*row)
    con.print(table)
    con.print()


def print_findings(con: Any, findings: list[dict[str, Any]], *, heading: str = "Findings") -> None:
    from rich.text import Text

    ranked = rank_findings(findings)
    if not ranked:
        con.print(f"{heading}: none.")
        return
    con.print(Text(f"{heading} (most important first)", style="bold"))
    for i, f in enumerate(ranked, 1):
        sev = str(f.get("severity", "info"))
        impact = f.get("impact")
        line = Text(f"{i}. ")
        line.append(f"[{sev.upper()}]", style=SEVERITY_STYLE.get(sev, ""))
        line.append(f" {f.get('title') or f.get('id') or 'finding'}", style="bold")
        if is_num(impact) and stake_text(f):
            line.append(f"  — {stake_text(f)}")
        con.print(line)
        if f.get("evidence"):
            con.print(Text(f"   evidence: {f['evidence']}"))
        if f.get("recommendation"):
            con.print(Text(f"   do: {f['recommendation']}"))
        if f.get("verify_with"):
            con.print(Text(f"   verify: {f['verify_with']}"))
        if f.get("tuned"):  # what a tune of this script measured (doctor/tuned.py)
            con.print(Text(f"   tuned: {f['tuned']}"))


def print_notes(con: Any, skipped: list[str], *, label: str = "") -> None:
    from rich.text import Text

    if not skipped:
        return
    con.print(Text(f"Notes{label}: {len(skipped)} unreadable record(s) skipped; everything else is shown.",
                   style="yellow"))
    for note in skipped[:MAX_NOTES]:
        con.print(Text(f"  - {note}"))
    if len(skipped) > MAX_NOTES:
        con.print(Text(f"  ... and {len(skipped) - MAX_NOTES} more"))


def time_goes_text(run: Any, summary: dict[str, Any]) -> str:
    """The report's first statement, where the step's time goes (doctor/checks/bound.py): as
    report.json stored it, else computed from the run directory (the rules are imported
    lazily, as telemetry/diagnosis.py does; a trimmed install without them shows none)."""
    report = run.report if isinstance(getattr(run, "report", None), dict) else {}
    try:
        from trainspeed.doctor.checks.bound import format_time_goes, time_goes
    except ImportError:
        return ""
    found = report.get("time_goes")
    if found is None and summary and getattr(run, "steps", None):
        try:
            found = time_goes(run, summary)
        except Exception:  # noqa: BLE001 - a statement must not cost the report
            return ""
    return format_time_goes(found) if isinstance(found, dict) else ""


def render_terminal(run: Any, summary: dict[str, Any], findings: list[dict[str, Any]], console: Any = None) -> None:
    """Print one run's report: summary, phase table, ranked findings, skipped-line notes."""
    from rich.rule import Rule
    from rich.text import Text

    con = _console(console)
    con.print(Rule(Text(f"trainspeed report: {run.name}", style="bold"), align="left"))
    statement = time_goes_text(run, summary)
    if statement:
        con.print(Text(statement, style="bold"))
        con.print()
    _print_summary(con, summary)
    con.print()
    _print_phases(con, summary)
    con.print()
    _print_ranks(con, summary)
    print_findings(con, findings)
    report = run.report if isinstance(getattr(run, "report", None), dict) else {}
    if isinstance(report.get("traceback"), str) and report["traceback"]:
        # The exception's type and first line (a multi-line message's last line says little);
        # runs written before the doctor recorded it fall back to the traceback's last line.
        error = (report.get("doctor") or {}).get("error") or report["traceback"].strip().splitlines()[-1]
        con.print(Text(f"The run crashed: {error}", style="bold red"))
    print_traces(con, run)
    print_notes(con, list(getattr(run, "skipped", []) or []))


def print_traces(con: Any, run: Any) -> None:
    """The profiler traces of the run (profile.steps / --profile-steps), with their paths."""
    from rich.text import Text

    from trainspeed.report.traces import VIEWER_HINT, profile_traces

    for trace in profile_traces(run):
        missing = "" if trace.exists else " (missing)"
        # soft_wrap: a path must stay one line to be copied
        con.print(Text(f"Profiler trace of steps {trace.steps}: {trace.path}{missing}"), soft_wrap=True)
        con.print(Text(f"  {VIEWER_HINT}", style="dim"))


def render_terminal_compare(a: Any, b: Any, console: Any = None, *, comparability: bool = False
                            ) -> list[dict[str, Any]]:
    """Print A vs B (LoadedRun each): metrics side by side with B/A and its reading. Returns the rows.
    `comparability`: first, how the runs differ (model, data, device, world size) and the
    throughput ratio's interval in words (`trainspeed report --compare`); the interval is
    bootstrapped once for those lines and the headline."""
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    from trainspeed.report.compare import comparability as comparability_of

    con = _console(console)
    if comparability:
        comp = comparability_of(a.run, b.run)
        for line in comp.lines():
            con.print(Text(line, style="bold yellow" if line.startswith("Warning") else "bold"))
        interval = comp.interval
    else:
        interval = loaded_interval(a, b)
    con.print(Rule(Text(f"trainspeed compare: A = {a.name}, B = {b.name}", style="bold"), align="left"))
    rows = compare_rows(a.summary, b.summary, interval)
    head = headline(rows, interval)
    if head:
        con.print(Text(head, style="bold"))
    table = Table()
    table.add_column("")
    table.add_column("metric")
    table.add_column(f"A: {a.name}", justify="right")
    table.add_column(f"B: {b.name}", justify="right")
    table.add_column("B/A", justify="right")
    table.add_column("reading")
    for r in rows:
        table.add_row(r["group"], r["metric"], fmt_value(r["a"], r["kind"]), fmt_value(r["b"], r["kind"]),
                      f"{r['ratio']:.2f}" if r["ratio"] is not None else "—", r["verdict"])
    con.print(table)
    con.print(Text(f"MFU: A {mfu_text(a.summary.get('mfu'))}; B {mfu_text(b.summary.get('mfu'))}"))
    con.print()
    print_findings(con, a.findings, heading=f"Findings for A ({a.name})")
    print_findings(con, b.findings, heading=f"Findings for B ({b.name})")
    print_notes(con, list(a.run.skipped or []), label=f" for A ({a.name})")
    print_notes(con, list(b.run.skipped or []), label=f" for B ({b.name})")
    return rows

