"""Load a run directory into what a report needs: the run, its summary, its ranked findings.

The summary comes from report.json when the run wrote one; otherwise (a crashed run, a run
directory copied without its report) it is computed from the step records with `summarize`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainspeed.report.fmt import rank_findings


@dataclass(kw_only=True, slots=True)
class LoadedRun:
    """A run directory as a report sees it."""

    run: Any
    """The RunData read by `trainspeed.telemetry.rundir.read_run`."""
    summary: dict[str, Any]
    """Summary figures (see `trainspeed.telemetry.summary.summarize` for the keys)."""
    findings: list[dict[str, Any]] = field(default_factory=list)
    """Findings from report.json, ranked by severity then impact."""
    summary_source: str = "report.json"
    """Where the summary came from: 'report.json' or 'computed from steps.jsonl'."""
    kind: str | None = None
    """report.json's kind ('train', 'doctor', 'tune'), when there is one."""
    traceback: str | None = None
    """The traceback report.json recorded for a crashed run."""

    @property
    def name(self) -> str:
        return self.run.name


def from_run(run: Any, summary: dict[str, Any] | None = None, findings: list[dict] | None = None) -> LoadedRun:
    """Wrap an already-read RunData; summary/findings default to report.json, then computed."""
    report = run.report if isinstance(getattr(run, "report", None), dict) else {}
    source = "given"
    if summary is None:
        stored = report.get("summary")
        if isinstance(stored, dict) and stored:
            summary, source = stored, "report.json"
        else:
            from trainspeed.telemetry.summary import summarize

            summary, source = summarize(run), "computed from steps.jsonl"
    if findings is None:
        stored_findings = report.get("findings")
        findings = stored_findings if isinstance(stored_findings, list) else []
    tb = report.get("traceback")
    return LoadedRun(
        run=run,
        summary=summary,
        findings=rank_findings(findings),
        summary_source=source,
        kind=report.get("kind") if isinstance(report.get("kind"), str) else None,
        traceback=tb if isinstance(tb, str) and tb else None,
    )


def load_run(run_dir: str | Path) -> LoadedRun:
    """Read a run directory (malformed lines are skipped and listed in run.skipped)."""
    from trainspeed.telemetry.rundir import read_run

    return from_run(read_run(run_dir))
