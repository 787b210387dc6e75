from __future__ import annotations

import pytest
import torch

from doctor_helpers import SCRIPTS


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
