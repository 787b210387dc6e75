"""SLURM's preemption warning (sbatch --signal=USR1@90): SIGUSR1's default action ended a run at
once, losing every step since the last periodic checkpoint, and the job for good. The Trainer now
saves at the step boundary, requeues the job with scontrol, and the restarted job (same command,
SLURM_RESTART_COUNT=1) continues that run from the checkpoint, with no --auto-resume in it.
scontrol is a stand-in on PATH that records its arguments (no SLURM here)."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from pathlib import Path

import pytest

from trainspeed.engine.checkpoint import slurm
from trainspeed.engine.trainer import Trainer
from trainspeed.telemetry import read_run
from trainspeed.telemetry.scheduler import env_record, job_id, restart_count

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_tiny import mse, tiny_data, tiny_model  # noqa: E402
from test_stop_resume import SignalAt  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _scontrol(tmp_path: Path, monkeypatch, *, rc: int = 0, stderr: str = "") -> Path:
    """A stand-in scontrol on PATH: appends its argv to calls.txt, exits with `rc`."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls.txt"
    tool = bindir / "scontrol"
    tool.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\necho '{stderr}' >&2\nexit {rc}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return calls


def _cfg(tmp_path, name="r", **ckpt):
    run = {"out_dir": str(tmp_path / "runs"), "max_steps": 8, "seed": 3, **({"name": name} if name else {})}
    return {"run": run, "data": {"batch_size": 8},
            "logging": {"every": 1, "warmup_steps": 0, "progress": False},
            "eval": {"at_end": False}, "checkpoint": {"async_save": False, **ckpt}}


@pytest.fixture
def in_job(monkeypatch):
    for key in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")


def test_sigusr1_saves_requeues_and_the_restarted_job_continues(tmp_path, monkeypatch, capsys, in_job):
    calls = _scontrol(tmp_path, monkeypatch)
    with pytest.raises(SystemExit) as stop:
        Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path),
                callbacks=[SignalAt(5, signal.SIGUSR1)]).fit()
    assert stop.value.code == 128 + signal.SIGUSR1
    run_dir = tmp_path / "runs" / "r"
    ckpt = run_dir / "checkpoints" / "step-00000005.pt"
    assert ckpt.exists()
    assert calls.read_text().split() == ["requeue", "4242"]
    err = capsys.readouterr().err
    assert (f"trainspeed: stopped at step 5; checkpoint saved to {ckpt}; requeued SLURM job 4242: "
            "it continues from this checkpoint when it starts again") in err
    assert json.loads((run_dir / "env.json").read_text())["slurm"] == {"job_id": "4242", "restart": 0}
    run = read_run(run_dir)
    assert [e["data"] for e in run.events if e["type"] == "requeue"] == [{"job": "4242", "error": None}]
    assert next(e for e in run.events if e["type"] == "interrupt")["data"]["signal"] == "SIGUSR1"

    # SLURM starts the job again: the same command (a derived run name, no --auto-resume)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, name=None)).fit()
    err = capsys.readouterr().err
    assert f"SLURM started job 4242 again (restart 1): continuing its run {run_dir}" in err
    assert f"resumed from {ckpt} at step 5" in err
    assert [s["step"] for s in read_run(run_dir).steps] == list(range(1, 9))
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["r"]  # no second run directory
    assert calls.read_text().split() == ["requeue", "4242"]  # a finished run requeues nothing


def test_a_failed_requeue_says_so_and_how_to_resume(tmp_path, monkeypatch, capsys, in_job):
    _scontrol(tmp_path, monkeypatch, rc=1, stderr="scontrol: error: Invalid job id specified")
    with pytest.raises(SystemExit):
        Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path),
                callbacks=[SignalAt(3, signal.SIGUSR1)]).fit()
    line = next(x for x in capsys.readouterr().err.splitlines() if "stopped at step 3" in x)
    assert ("not requeued (scontrol requeue 4242 exited with 1: scontrol: error: Invalid job id "
            "specified); resume with ") in line
    assert (tmp_path / "runs" / "r" / "checkpoints" / "step-00000003.pt").exists()


def test_outside_slurm_or_with_requeue_off_sigusr1_saves_and_names_the_resume(tmp_path, monkeypatch, capsys, in_job):
    calls = _scontrol(tmp_path, monkeypatch)
    monkeypatch.delenv("SLURM_JOB_ID")
    with pytest.raises(SystemExit):
        Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path),
                callbacks=[SignalAt(4, signal.SIGUSR1)]).fit()
    assert "stopped at step 4; checkpoint saved to" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with pytest.raises(SystemExit):
        Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, name="q", requeue=False),
                callbacks=[SignalAt(2, signal.SIGUSR1)]).fit()
    assert "resume with" in capsys.readouterr().err
    assert not calls.exists()  # scontrol never ran


def test_a_hosts_own_sigusr1_handler_stays(tmp_path, in_job):
    seen = []
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path),
                callbacks=[SignalAt(3, signal.SIGUSR1)]).fit()  # runs to the end
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert seen == [signal.SIGUSR1]
    assert [s["step"] for s in read_run(tmp_path / "runs" / "r").steps] == list(range(1, 9))


def test_a_restart_continues_only_this_jobs_run_with_a_checkpoint(tmp_path, monkeypatch, capsys, in_job):
    runs = tmp_path / "runs"
    other = runs / "other-job"
    other.mkdir(parents=True)
    (other / "env.json").write_text(json.dumps({"slurm": {"job_id": "77", "restart": 0}}))
    mine = runs / "mine"
    mine.mkdir()
    (mine / "env.json").write_text(json.dumps({"slurm": {"job_id": "4242", "restart": 0}}))
    assert slurm.run_of_job(runs, "4242") == mine and slurm.run_of_job(runs, "5") is None
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    # "mine" stopped before its first save: a new run starts, and says nothing of continuing
    cfg = _cfg(tmp_path, name="fresh")
    cfg["run"]["max_steps"] = 2
    Trainer(tiny_model(), mse, tiny_data(), config=cfg).fit()
    assert "continuing its run" not in capsys.readouterr().err
    assert [s["step"] for s in read_run(runs / "fresh").steps] == [1, 2]


def test_the_job_id_is_the_one_scontrol_takes():
    assert job_id({"SLURM_JOB_ID": "11"}) == "11"
    assert job_id({"SLURM_JOB_ID": "11", "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "3"}) == "10_3"
    assert job_id({"SLURM_JOB_ID": "11; rm -rf ~"}) is None and job_id({}) is None
    assert restart_count({"SLURM_RESTART_COUNT": "2"}) == 2 and restart_count({"SLURM_RESTART_COUNT": "x"}) == 0
    assert env_record({}) is None
    assert env_record({"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "1"}) == {"job_id": "9", "restart": 1}
    assert slurm.requeue("9", run=lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError())) == \
        "scontrol is not on this node's PATH"


def test_a_rank_that_leaves_the_save_to_rank_0_ignores_sigusr1_meanwhile():
    """Under torchrun SLURM signals every worker: DDP's rank 1 (no handlers: rank 0's state is
    everyone's) died of SIGUSR1 at once and rank 0's save met a dead peer (a crash save, no
    requeue). It now ignores SIGUSR1 while training; a host's own handler stays."""
    from trainspeed.engine.checkpoint.emergency import EmergencySaver

    before = signal.getsignal(signal.SIGUSR1)
    assert before is signal.SIG_DFL
    with EmergencySaver(enabled=False) as saver:
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN and not saver.installed
        os.kill(os.getpid(), signal.SIGUSR1)  # would end pytest
        assert not saver.requested
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL

    def own(signum, frame):
        return None

    signal.signal(signal.SIGUSR1, own)
    try:
        with EmergencySaver(enabled=False):
            assert signal.getsignal(signal.SIGUSR1) is own
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_an_srun_task_beyond_the_first_is_told_it_trains_alone(monkeypatch):
    """srun --ntasks=4 trainspeed train ... starts 4 single-process runs (ranks come from
    torchrun): tasks 1.. say so; a sweep of separate runs by srun tasks still runs."""
    import torch

    from trainspeed.config import TrainConfig
    from trainspeed.engine.distributed import setup_distributed

    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "2")
    dist, _ = setup_distributed(TrainConfig(), torch.device("cpu"))
    assert not dist.active and any("SLURM task 2 of an srun step trains alone" in n for n in dist.notes)
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert not any("SLURM" in n for n in setup_distributed(TrainConfig(), torch.device("cpu"))[0].notes)
