"""Findings are a function of the run directory, whoever wrote it.

The end of every run stores its findings in report.json: `Monitor.close` (so a `Monitor` loop,
the `Trainer`, the Lightning and Hugging Face callbacks) and the CLI's end of run. A run whose
report.json has no diagnosis (written before findings were stored at every run's end, or a
run that crashed before its report) gets one from `trainspeed report`, via `ensure_findings`.

Layering: telemetry sits below the rules (doctor/checks, pure functions of a RunData), so this
module does not import them. It calls a *diagnoser*, `(run, summary) -> [finding dict]`,
resolved when a run ends: the one installed with `set_diagnoser`, else the default named by
DEFAULT_DIAGNOSER, imported then (~40 ms, once per process; the rules import numpy only).
Nothing here imports the rules at module import, so `import trainspeed.telemetry.monitor` stays
as light as before. A diagnoser that is missing or fails never fails the run: the records are
the result, findings are advice (a failure becomes one info finding that says so).

Stored findings win over recomputing (`ensure_findings(force=False)`): they were computed by
the rules of the version that wrote the records, at the end of the run, and a report of an
archived run should not change under it. Every finding the rules make is reproducible from the
run directory alone (the doctor's observations are events in events.jsonl), so nothing is lost
by recomputing either: `trainspeed report RUN --rediagnose` re-runs this version's rules.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any, Callable

Diagnoser = Callable[[Any, "dict[str, Any] | None"], "list[dict[str, Any]]"]
"""`(run: RunData, summary: dict | None) -> ranked finding dicts` (see doctor/findings.py)."""

DEFAULT_DIAGNOSER = "trainspeed.doctor.checks:diagnose"
"""`module:function` of the rules used when none was installed: named, imported at a run's end."""

DIAGNOSIS_KEY = "diagnosis"
"""report.json key saying the findings were computed: {"by", "at", "findings"}."""

_installed: Diagnoser | None = None


def set_diagnoser(diagnoser: Diagnoser | None) -> Diagnoser | None:
    """Install the diagnoser used at every run's end (None: back to DEFAULT_DIAGNOSER);
    returns the previous one, so a test can restore it."""
    global _installed
    previous, _installed = _installed, diagnoser
    return previous


def get_diagnoser() -> Diagnoser | None:
    """The installed diagnoser, else the default one imported now; None when the rules are not
    importable (a trimmed install)."""
    if _installed is not None:
        return _installed
    module, _, attr = DEFAULT_DIAGNOSER.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError:
        return None


def diagnose_run(run: Any, summary: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Findings of a read run directory (RunData). Never raises: a diagnoser that fails gives
    one info finding naming the error (the end of a training run must not die on our bug)."""
    diagnoser = get_diagnoser()
    if diagnoser is None:
        return []
    try:
        return list(diagnoser(run, summary))
    except Exception as exc:  # noqa: BLE001 - advice must not cost the run
        return [{"id": "check_error.diagnose", "severity": "info", "title": "the diagnosis failed",
                 "evidence": f"{type(exc).__name__}: {exc}", "recommendation": "please report this trainspeed bug",
                 "verify_with": None, "impact": 0.0, "impact_estimated": False}]


def diagnosis_record(findings: list[dict[str, Any]], *, by: str) -> dict[str, Any]:
    """report.json's DIAGNOSIS_KEY value: what computed the findings ("Monitor.close",
    "trainspeed report", "given" by the caller), with which version, when, how many."""
    import trainspeed

    return {"by": by, "version": trainspeed.__version__, "at": round(time.time(), 3), "findings": len(findings)}


def end_of_run_report(run: Any, summary: dict[str, Any], *, kind: str, given: list[dict[str, Any]] | None,
                      traceback: str | None) -> dict[str, Any]:
    """The report.json `Monitor.close` writes: the summary and the run's findings with their
    "diagnosis" record. Findings passed to close() are stored as given; a doctor run (kind
    "doctor") keeps none here, since the doctor diagnoses after close, with its own report;
    otherwise the rules run on the run as read back (~0.05 s for a 100-step run, plus ~40 ms to
    import them once)."""
    from trainspeed.telemetry import schema

    report = {"schema": schema.SCHEMA_VERSION, "kind": kind, "summary": summary, "findings": given or [],
              "traceback": traceback}
    if given is not None:
        report[DIAGNOSIS_KEY] = diagnosis_record(given, by="given")
    elif kind != "doctor":
        report["findings"] = diagnose_run(run, summary)
        report[DIAGNOSIS_KEY] = diagnosis_record(report["findings"], by="Monitor.close")
    return report


def has_diagnosis(report: dict[str, Any] | None) -> bool:
    """True when report.json holds computed findings: it says so (DIAGNOSIS_KEY), or it lists
    some (the doctor's report). `"findings": []` alone is what a Monitor wrote before findings
    were computed at every run's end: not a diagnosis."""
    if not isinstance(report, dict):
        return False
    if isinstance(report.get(DIAGNOSIS_KEY), dict):
        return True
    findings = report.get("findings")
    return isinstance(findings, list) and len(findings) > 0


def ensure_findings(run_dir: str | Path, *, force: bool = False) -> tuple[list[dict[str, Any]], bool]:
    """(findings, stored) of a run directory: report.json's when it holds a diagnosis (and not
    `force`), else computed from the records and written into report.json (its other keys
    kept; no summary is added, so a report still says where its summary came from). `stored`
    is False when report.json could not be written (a read-only copy of a run)."""
    from trainspeed.telemetry import schema
    from trainspeed.telemetry.rundir import read_run, write_json

    run = read_run(run_dir)
    report = run.report if isinstance(run.report, dict) else None
    if not force and has_diagnosis(report):
        return list(report.get("findings") or []), True  # type: ignore[union-attr]
    stored_summary = (report or {}).get("summary")
    findings = diagnose_run(run, stored_summary if isinstance(stored_summary, dict) and stored_summary else None)
    updated = dict(report or {"schema": schema.SCHEMA_VERSION})
    updated["findings"] = findings
    updated[DIAGNOSIS_KEY] = diagnosis_record(findings, by="trainspeed report")
    # The top statement (where the time goes, with its tune command) comes from the same rules:
    # a kept one would contradict the findings just recomputed. The report computes it afresh.
    updated.pop("time_goes", None)
    try:
        write_json(Path(run_dir) / schema.REPORT_JSON, updated)
    except OSError:
        return findings, False
    return findings, True


__all__ = ["DEFAULT_DIAGNOSER", "DIAGNOSIS_KEY", "Diagnoser", "diagnose_run", "diagnosis_record",
           "end_of_run_report", "ensure_findings", "get_diagnoser", "has_diagnosis", "set_diagnoser"]
