"""End of a CLI run: add findings to report.json, then render the report (terminal + HTML).

Shared by `train`, `doctor` and `tune` so every run directory ends the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def add_findings(run_dir: Path, *, force: bool = False) -> list[dict[str, Any]]:
    """The run's findings, stored in report.json: those its end of run computed (Monitor.close,
    the doctor), else the rules run now over the run directory (telemetry/diagnosis.py)."""
    from trainspeed.telemetry.diagnosis import ensure_findings

    findings, _ = ensure_findings(run_dir, force=force)
    return findings


def plain_summary(run_dir: Path) -> None:
    report = json.loads((run_dir / "report.json").read_text())
    s = report.get("summary", {})
    st = s.get("step_time") or {}
    print(f"run: {run_dir}")
    print(f"  steps {s.get('steps')}  samples/s {s.get('samples_per_s') or 0:.1f}  "
          f"tokens/s {s.get('tokens_per_s') or 0:.0f}  step p50 {1e3 * (st.get('p50') or 0):.2f} ms")
    shares = {k: v.get("share") or 0 for k, v in (s.get("phases") or {}).items()}
    print("  phases: " + "  ".join(f"{k} {100 * v:.0f}%" for k, v in
                                   sorted(shares.items(), key=lambda kv: -kv[1]) if v >= 0.005))


def finish_run(run_dir: str | Path, *, kind: str, html: bool = True) -> Path | None:
    run_dir = Path(run_dir)
    add_findings(run_dir)
    try:
        from trainspeed.report import render_run
    except ImportError:
        plain_summary(run_dir)
        return None
    return render_run(run_dir, html=html)
