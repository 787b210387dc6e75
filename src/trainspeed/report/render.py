"""Entry points other layers call: render one run, or compare two, to the terminal and HTML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainspeed.errors import MissingDependencyError
from trainspeed.report.load import LoadedRun, load_run
from trainspeed.telemetry.schema import REPORT_HTML

COMPARE_HTML = "compare.html"


def _html_path(html: bool | str | Path, default: Path) -> Path | None:
    if html is False or html is None:
        return None
    if html is True:
        return default
    return Path(html)


def _say(console: Any, text: str) -> None:
    from rich.text import Text

    if console is None:
        from trainspeed.rich_console import new_console

        console = new_console(stderr=True)
    console.print(Text(text))


def _write(run: LoadedRun, out: Path, console: Any, compare: LoadedRun | None = None) -> Path | None:
    from trainspeed.report.html import write_html

    try:
        path = write_html(run.run, out, summary=run.summary, findings=run.findings, compare=compare)
    except MissingDependencyError as exc:
        # The terminal report is complete without HTML; say how to get it rather than fail.
        _say(console, f"HTML report skipped: {exc}")
        return None
    _say(console, f"HTML report: {path}")
    return path


def render_run(run_dir: str | Path, *, html: bool | str | Path = True, console: Any = None,
               terminal: bool = True, report: dict[str, Any] | None = None) -> Path | None:
    """Print the report of one run directory; write report.html (or `html` when a path).
    `report`: what its report.json would hold, for a run directory that lacks one (the doctor's
    on a full disk: its findings, not those the engine's rules compute from the records).

    Returns the HTML path, or None when no HTML was written (html=False, or no matplotlib).
    """
    from trainspeed.report.terminal import render_terminal

    loaded = load_run(run_dir)
    if report is not None and not isinstance(loaded.run.report, dict):
        from trainspeed.report.load import from_run

        loaded.run.report = report
        loaded = from_run(loaded.run)
    if terminal:
        render_terminal(loaded.run, loaded.summary, loaded.findings, console=console)
    out = _html_path(html, Path(run_dir) / REPORT_HTML)
    return _write(loaded, out, console) if out is not None else None


def render_compare(a_dir: str | Path, b_dir: str | Path, *, html: bool | str | Path = True, console: Any = None,
                   terminal: bool = True, comparability: bool = False) -> Path | None:
    """Print A vs B side by side; write the comparison HTML (default: B's directory/compare.html).
    `comparability`: the terminal starts with how the runs differ and the ratio's interval."""
    from trainspeed.report.terminal import render_terminal_compare

    a, b = load_run(a_dir), load_run(b_dir)
    if terminal:
        render_terminal_compare(a, b, console=console, comparability=comparability)
    out = _html_path(html, Path(b_dir) / COMPARE_HTML)
    return _write(a, out, console, compare=b) if out is not None else None


def report_json(a: LoadedRun, b: LoadedRun | None = None) -> dict[str, Any]:
    """The machine-readable form of what the terminal shows (for `trainspeed report --json`)."""

    def one(lr: LoadedRun) -> dict[str, Any]:
        return {"run": str(lr.run.path), "kind": lr.kind, "summary": lr.summary,
                "summary_source": lr.summary_source, "findings": lr.findings, "skipped": list(lr.run.skipped)}

    if b is None:
        return one(a)
    from trainspeed.report.compare import compare_rows

    return {"a": one(a), "b": one(b), "compare": compare_rows(a.summary, b.summary)}
