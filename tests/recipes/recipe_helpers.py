"""Readers of run directories for the recipe tests."""

from __future__ import annotations

import json
from pathlib import Path


def step_losses(run_dir: Path) -> list[float]:
    """Per-step losses of a run directory (logging.every=1)."""
    rows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines() if line.strip()]
    return [r["loss"] for r in rows if r.get("loss") is not None]


def events(run_dir: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r["type"] == kind]
