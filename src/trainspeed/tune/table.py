"""The tune's table, in the terminal (rich) and as a self-contained HTML page.

Rows come from `TuneResult`; formatting reuses the report's helpers and its HTML page shell,
so the tune page looks like every other trainspeed report.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from trainspeed.tune import stats
from trainspeed.tune.result import Row, TuneResult
from trainspeed.tune.table_layout import RIGHT

COLUMNS = ("knob", "setting", "at stake", "speedup", "95% CI", "noise", "one-time", "memory", "loss delta",
           "verdict", "note")
NUMERIC = RIGHT  # right-aligned figures, in the terminal and the HTML alike
VERDICT_STYLE = {stats.FASTER: "bold green", stats.SLOWER: "red", stats.LOSS_MISMATCH: "bold red",
                 stats.FAILED: "bold red", stats.NO_CHANGE: "", stats.SKIPPED: "dim", stats.BUSY: "yellow"}


def cells(row: Row) -> list[str]:
    """The row as display strings (shared by terminal, HTML and docs)."""
    def x(v: float | None) -> str:
        return "—" if v is None or not math.isfinite(v) else f"{v:.2f}x"

    ci = "—" if not row.ci or not all(math.isfinite(v) for v in row.ci) else f"{row.ci[0]:.2f}–{row.ci[1]:.2f}"
    mem = "—" if row.memory_ratio is None else f"{100 * (row.memory_ratio - 1):+.0f}%"
    if row.loss_delta is None:
        loss = "—"
    elif not math.isfinite(row.loss_delta):
        loss = "non-finite"
    else:
        loss = f"{100 * row.loss_delta:+.1f}%"
    noise = "—" if row.noise is None or not math.isfinite(row.noise) else f"±{100 * row.noise:.0f}%"
    note = (row.note or "").splitlines()[0] if row.note else ""
    why = why_no_change(row)
    if why:
        note = f"{why}; {note}" if note else why
    # the doctor's prediction beside the measured gain; a one-time cost apart (one_time.py)
    stake = "—" if row.stake is None else f"{100 * row.stake:.0f}%"
    # a break-even only for a measured gain: dcgan's compile at 1.00x (CI 0.95-1.05) read
    # "+4 s, pays off after 17,821 steps"
    once = "—" if not row.one_time else (f"+{row.one_time[0]:.0f} s" + (
        f", pays off after {row.one_time[1]:,} steps" if row.one_time[1] and row.verdict == stats.FASTER
        else ", no measured gain pays it back" if row.one_time[1] else ", never pays off"))
    return [row.knob, row.setting, stake, x(row.speedup), ci, noise, once, mem, loss, row.verdict, note]


def why_no_change(row: Row) -> str:
    """Why a measured row reads 'no measurable change': its CI reaches into the noise band
    (and what set the band). Empty for any other verdict."""
    if row.verdict != stats.NO_CHANGE or not row.ci or row.noise is None:
        return ""
    if not all(math.isfinite(v) for v in row.ci):
        return "no finite interval"
    if row.ci_clears_band:
        # the CI clears the band, and another rule (spend.confirm: the rounds after a hopeful
        # was chosen) read no change: its note says which; this one would be false (dcgan's
        # channels_last: "CI 1.14-1.19 reaches into the noise band 0.89-1.13x")
        return ""
    low, high = stats.noise_band(row.noise)
    return (f"CI {row.ci[0]:.2f}–{row.ci[1]:.2f} reaches into the noise band {low:.2f}–{high:.2f}x"
            + (f" ({row.noise_from})" if row.noise_from else ""))


def mfu_text(mfu: float) -> str:
    """'MFU 38 %', or two digits under 10 % ('MFU 0.12 %', not 'MFU 0 %')."""
    share = 100 * mfu
    return f"MFU {share:.0f} %" if share >= 10 else f"MFU {share:.2g} %"


def baseline_line(result: TuneResult) -> str:
    """One line on the baseline: its cost per sample and, when known, its MFU."""
    line = f"baseline: {1e3 * result.baseline_cost_s:.3f} ms/sample"
    if result.baseline_mfu is not None:
        line += f", {mfu_text(result.baseline_mfu)} of {result.peak_name or 'the device peak'}"
    else:
        line += (", MFU unknown (no FLOP count of its step, or no peak for this device; a script tune counts "
                 "them in its first baseline trial, or takes them from the doctor run given with --from)")
    return line


def final_title(final: Row) -> str:
    """The answer's table title: "Verified" only where it was verified afresh against the baseline.
    reinforce.py's 3m tune showed a one-round 1.32x under "Verified" when the budget had left the
    verification unrun (the ablation's row, given as the answer: verify.ablation_answer)."""
    if final.unverified:
        return "Answer: best config vs baseline, as measured in the ablation (not verified afresh)"
    return "Verified: best config vs baseline"


def markdown(result: TuneResult) -> str:
    """The ablation and combination tables as Markdown (for docs and READMEs)."""
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    def body(rows: list[Row]) -> str:
        return "".join("| " + " | ".join(c.replace("|", "/") for c in cells(r)) + " |\n" for r in rows)
    out = baseline_line(result) + "\n\nAblation (each setting alone vs the baseline)\n\n" + head + body(result.ablation)
    if result.combination:
        out += "\nGreedy combination (each step vs the config before it)\n\n" + head + body(result.combination)
    if result.final:
        out += f"\n{final_title(result.final)}\n\n" + head + body([result.final])
    return out


def print_tables(result: TuneResult, console: Any = None) -> None:
    """The tables at the console's width: the terminal's, or rich_console's for a pipe or a
    file (each table's notes under it where the row has no room for them, table_layout.py)."""
    from trainspeed.rich_console import new_console
    from trainspeed.tune.table_layout import fitted_table

    con = console if console is not None else new_console()

    def table(title: str, rows: list[Row]) -> None:
        t, notes = fitted_table(con, title, rows, COLUMNS, cells, VERDICT_STYLE)
        con.print(t)
        for line in notes:
            con.print(line, markup=False, highlight=False)

    con.print(baseline_line(result))
    table("Ablation: each setting alone vs the baseline", result.ablation)
    if result.combination:
        table("Greedy combination: each winner on top of the ones before", result.combination)
    if result.final:
        table(final_title(result.final), [result.final])
    for note in result.notes:
        con.print(f"[yellow]note:[/] {note}")


def write_html(result: TuneResult, path: str | Path, *, title: str, subtitle: str,
               write: Callable[..., Path] | None = None) -> Path:
    """The tables as a page, written atomically (or through `write`: a FileSet's)."""
    from trainspeed.fileio import atomic_write_text
    from trainspeed.report.templating import render

    def table(rows: list[Row]) -> list[list[tuple[str, str]]]:
        """Each row's cells as (css class, text)."""
        out = []
        for row in rows:
            verdict = {stats.FASTER: "better", stats.SLOWER: "worse", stats.LOSS_MISMATCH: "worse",
                       stats.FAILED: "worse"}.get(row.verdict, "")
            out.append([("num" if col in NUMERIC else f"verdict {verdict}".strip() if col == "verdict" else "", text)
                        for col, text in zip(COLUMNS, cells(row))])
        return out

    best = ", ".join(f"{k}={v}" for k, v in sorted(result.best_settings.items())) or "the baseline (no knob won)"
    page = render("tune.html.j2", title=title, subtitle=subtitle, columns=[(c, c in NUMERIC) for c in COLUMNS],
                  baseline=baseline_line(result), ablation=table(result.ablation),
                  combination=table(result.combination), final=table([result.final]) if result.final else [],
                  final_title=final_title(result.final) if result.final else "",
                  best=best, notes=result.notes, trials_run=result.trials_run, trials_reused=result.trials_reused,
                  elapsed=f"{result.elapsed_s:.0f}")
    return (write or atomic_write_text)(path, page)


def result_from_json(data: dict[str, Any]) -> TuneResult:
    """Rebuild a TuneResult from tune.json (to re-render an earlier tune's tables)."""
    def row(d: dict[str, Any] | None) -> Row | None:
        if d is None:
            return None
        return Row(knob=d["knob"], setting=d["setting"], settings=d.get("settings") or {},
                   verdict=d["verdict"], speedup=d.get("speedup"),
                   ci=tuple(d["ci"]) if d.get("ci") else None, noise=d.get("noise"),
                   noise_from=d.get("noise_from") or "",
                   memory_ratio=d.get("memory_ratio"), loss_delta=d.get("loss_delta"),
                   loss_deltas=d.get("loss_deltas") or {},
                   note=d.get("note") or "", unverified=bool(d.get("unverified")))

    return TuneResult(ablation=[row(d) for d in data["ablation"]],
                      combination=[row(d) for d in data["combination"]],
                      best_settings=data["best_settings"], final=row(data.get("final")),
                      baseline_cost_s=data.get("baseline_cost_s_per_sample") or 0.0,
                      trials_run=data.get("trials_run", 0), trials_reused=data.get("trials_reused", 0),
                      elapsed_s=data.get("elapsed_s", 0.0), notes=data.get("notes") or [],
                      baseline_mfu=data.get("baseline_mfu"), peak_name=data.get("peak_name"))
