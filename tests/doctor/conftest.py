from __future__ import annotations

from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[1] / "assets" / "scripts"


@pytest.fixture(autouse=True)
def _one_thread():
    # Two OpenMP threads on a shared 2-core machine spin against other tenants and make tiny
    # models 100x slower; the scripts are single-threaded-sized anyway.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def doctor(tmp_path, monkeypatch):
    """Run a script from tests/assets/scripts under the doctor in a scratch cwd."""
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    monkeypatch.chdir(tmp_path)

    def run(script: str, *args: str, steps: int | None = 40, **kw):
        config = DoctorConfig(command=["python", str(SCRIPTS / script), *args], steps=steps,
                              out=tmp_path / "run", system_sampler=kw.pop("system_sampler", False), **kw)
        return run_doctor(config)

    return run


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
