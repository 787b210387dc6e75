"""Helpers shared by the doctor's tests. A module of its own, not conftest.py: `from conftest
import ...` took whichever folder's conftest was imported last (tests/report has one too), so
these tests failed to collect when run beside another folder."""

from __future__ import annotations

from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "assets" / "scripts"


def ids(result) -> list[str]:
    return [f["id"] for f in result.findings]


def script_findings(findings: list[dict]) -> list[dict]:
    """The findings about the script, in rank order: the machine's own (other processes' load,
    which a busy test machine adds and a quiet one does not) are left out, after checking that
    each is one (nothing at stake, "not the script"), so a verdict on the script reads the same
    on a quiet and on a loaded machine."""
    from trainspeed.doctor.checks.machine import MACHINE_FINDINGS

    for f in findings:
        if f["id"] in MACHINE_FINDINGS:
            assert f["impact"] == 0.0 and "(not the script)" in f["title"], f
    return [f for f in findings if f["id"] not in MACHINE_FINDINGS]


def warnings_or_worse(result) -> list[dict]:
    """The script's findings at warning level or above (the machine's load is not the script's)."""
    return [f for f in script_findings(result.findings) if f["severity"] in ("warning", "critical")]


def run_inline(tmp_path, source: str, steps: int | None = 20, name: str = "train.py"):
    """Write `source` as a script in tmp_path and run it under the doctor (cwd: tmp_path)."""
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    script = tmp_path / name
    script.write_text(source)
    return run_doctor(DoctorConfig(command=["python", str(script)], steps=steps, out=tmp_path / "run",
                                   system_sampler=False))


def observations(result, kind: str) -> list[dict]:
    """The observation events of one kind in a doctor run's events.jsonl."""
    import json

    events = [json.loads(line) for line in (result.run_dir / "events.jsonl").read_text().splitlines()]
    return [e["data"] for e in events if e["type"] == "observation" and e["data"]["kind"] == kind]


def step_records_fill_after(monkeypatch, writes: int) -> None:
    """The run directory's disk fills after `writes` writes of step records (JSONL sink):
    each later one fails with ENOSPC."""
    import errno
    import os

    from trainspeed.sinks import jsonl

    real = jsonl.write_all
    calls = {"n": 0}

    def filling(fd, data):
        calls["n"] += 1
        if calls["n"] > writes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(jsonl, "write_all", filling)
