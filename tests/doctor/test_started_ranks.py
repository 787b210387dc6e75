"""A script that starts its own ranks (Lightning's DDP as `python train.py`): when the doctor
stops it at --steps, those ranks would wait for rank 0 at their next collective (gloo: a page of
"Connection closed by peer"; NCCL: a hang until its timeout), so the doctor ends them, as
Lightning does on Ctrl-C; the script's DataLoader workers are not ranks and are left to it."""

from __future__ import annotations

import json
import textwrap
import time

import psutil
import pytest

from trainspeed.doctor.runner import DoctorConfig, run_doctor

pytestmark = pytest.mark.timeout(60)

SCRIPT = textwrap.dedent('''
    import os, subprocess, sys, time
    import torch
    from pathlib import Path

    # "rank 1", started as Lightning starts it: the same interpreter, LOCAL_RANK=1 in its environment
    rank1 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, "LOCAL_RANK": "1"})
    # not a rank: left alone, also when it inherits a LOCAL_RANK set in this process since its start
    # (the doctor sets RANK=0 LOCAL_RANK=0 while a script that imports deepspeed runs without a launcher)
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    Path("pids").write_text(f"{rank1.pid} {helper.pid}")
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10_000):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
''')


def _process(pid: int) -> psutil.Process | None:
    """The process, or None when it has ended and been reaped: the script's Popen objects go with
    its globals when the doctor is done with them, and the next subprocess call reaps the dead."""
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


@pytest.mark.parametrize("local_rank", [None, "0"])
def test_ranks_the_script_started_are_ended_when_the_doctor_stops_it(tmp_path, monkeypatch, local_rank):
    monkeypatch.chdir(tmp_path)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:  # set while the script runs, not at this process's start
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    (tmp_path / "train.py").write_text(SCRIPT)
    result = run_doctor(DoctorConfig(command=["python", "train.py"], steps=5, out=tmp_path / "run",
                                     system_sampler=False))
    assert (result.stopped, result.steps) == ("steps", 5)
    rank1, helper = (_process(int(pid)) for pid in (tmp_path / "pids").read_text().split())
    try:
        deadline = time.monotonic() + 10
        while rank1 is not None and rank1.is_running() and rank1.status() != psutil.STATUS_ZOMBIE \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rank1 is None or not rank1.is_running() or rank1.status() == psutil.STATUS_ZOMBIE
        assert helper is not None and helper.is_running() and helper.status() != psutil.STATUS_ZOMBIE
    finally:
        for proc in (rank1, helper):
            if proc is not None and proc.is_running():
                proc.kill()
                proc.wait(5)
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    doctor = [e["data"] for e in events if e["type"] == "observation" and e["data"].get("kind") == "doctor"]
    assert [d.get("ended_ranks") for d in doctor] == [1]
