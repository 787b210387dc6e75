"""SLURM's SIGUSR1 under torchrun (2 CPU ranks, gloo), passed to the workers as the batch script
in docs/faults.md does: rank 0 saves at the step boundary (every rank, its shard, under FSDP),
scontrol requeues the job once, and the same command started again by SLURM
(SLURM_RESTART_COUNT=1) continues the run from that checkpoint. Under DDP, rank 1 died of the
signal at once and rank 0 only crash-saved, with no requeue. scontrol is a stand-in on PATH."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import psutil
import pytest

from test_fsdp_saves import _cmd, _env, _events, _saves, wait_started

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _slurm_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    tool = bindir / "scontrol"
    tool.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls.txt'}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    env = _env(SLURM_JOB_ID="4242", **extra)
    if "SLURM_RESTART_COUNT" not in extra:  # a first start, whatever this shell has
        env.pop("SLURM_RESTART_COUNT", None)
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    return env


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_sigusr1_to_the_workers_saves_requeues_once_and_the_restart_continues(tmp_path, strategy):
    run = tmp_path / strategy
    proc = subprocess.Popen(_cmd(tmp_path, strategy, f"distributed.strategy={strategy}", "run.max_steps=100000",
                                 "distributed.signal_check_every=2"),
                            env=_slurm_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_started(proc, run)
        workers = psutil.Process(proc.pid).children()
        assert len(workers) == 2
        for worker in workers:  # the batch script's `pkill -USR1 -P $torchrun`
            worker.send_signal(signal.SIGUSR1)
        out = proc.communicate(timeout=90)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (tmp_path / "calls.txt").read_text().split() == ["requeue", "4242"], out[-3000:]
    saves = _saves(run)
    assert len(saves) == 1 and saves[0]["reason"] == "signal", out[-3000:]
    step = saves[0]["ckpt_step"]
    assert f"stopped at step {step}; checkpoint saved to" in out and "requeued SLURM job 4242" in out
    assert "crash" not in [e["type"] for e in _events(run, 0)]

    again = subprocess.run(_cmd(tmp_path, strategy, f"distributed.strategy={strategy}", f"run.max_steps={step + 2}"),
                           env=_slurm_env(tmp_path, SLURM_RESTART_COUNT="1"), capture_output=True, text=True,
                           timeout=120)
    said = again.stdout + again.stderr
    assert again.returncode == 0, said[-3000:]
    assert f"SLURM started job 4242 again (restart 1): continuing its run {run}" in said
    steps = [json.loads(line)["step"] for line in (run / "steps.jsonl").read_text().splitlines()]
    assert steps == list(range(1, step + 3))  # no gap, no step twice
    assert (tmp_path / "calls.txt").read_text().split() == ["requeue", "4242"]  # requeued once
