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


def warnings_or_worse(result) -> list[dict]:
    return [f for f in result.findings if f["severity"] in ("warning", "critical")]


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
