"""The doctor under torchrun: every rank instruments the user's unchanged DDP script, rank 0
reports per-rank figures and names the rank that waits for its data."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainspeed.doctor.checks.context import CheckContext
from trainspeed.doctor.runner import DoctorConfig, run_doctor
from trainspeed.errors import ConfigError
from trainspeed.telemetry.rundir import read_run

SCRIPT = Path(__file__).resolve().parents[1] / "assets" / "distributed" / "slow_rank_ddp.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_doctor_as_one_of_several_ranks_needs_out(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="WORLD_SIZE=2.*give --out RUN_DIR"):
        run_doctor(DoctorConfig(command=[str(SCRIPT)]))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_doctor_reports_every_rank_and_the_straggler(tmp_path):
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "doc"
    # the command the user runs, given to the doctor as it is (it goes in under the launcher);
    # `torchrun -m trainspeed doctor ...` is the form test_deepspeed_script runs
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                str(_free_port())]
    proc = subprocess.run(
        [sys.executable, "-m", "trainspeed", "doctor", "--steps", "12", "--out", str(out), "--no-html", "--",
         *launcher, str(SCRIPT)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("Per rank (data parallel)") == 1  # rank 0 reports, rank 1 stays quiet
    assert (out / "ranks" / "rank1" / "steps.jsonl").exists()
    report = json.loads((out / "report.json").read_text())
    rows = report["summary"]["ranks"]
    assert [r["rank"] for r in rows] == [0, 1] and [r["steps"] for r in rows] == [12, 12]
    # rank 1 sleeps 4 ms per sample in __getitem__: ~32 ms of data wait per step, rank 0 ~0
    assert rows[1]["data_wait_p50"] > 0.025 and rows[0]["data_wait_p50"] < 0.5 * rows[1]["data_wait_p50"]
    assert rows[1]["straggler"] and not rows[0]["straggler"]
    assert "unmeasured_ranks" not in [f["id"] for f in report["findings"]]  # both ranks ran the doctor
    found = [f for f in report["findings"] if f["id"] == "straggler"]
    assert len(found) == 1 and "rank 1" in found[0]["title"] and "data wait" in found[0]["evidence"]
    # a doctor run the findings suggest relaunches the script as it was typed: under the launcher
    ctx = CheckContext.from_run(read_run(out), report["summary"])
    assert ctx.doctor_command() == f"trainspeed doctor --steps 12 -- {shlex.join(launcher)} {SCRIPT}"
    assert ctx.tune_command("num_workers") == f"trainspeed tune --knobs num_workers -- python {SCRIPT}"
    # the form torchrun's own ranks report without a recorded launcher: 2 ranks, one --out
    ctx.run.config.pop("launcher")
    assert ctx.doctor_command() == (f"torchrun --nproc_per_node 2 -m trainspeed doctor --steps 12 --out {out}-after "
                                    f"-- python {SCRIPT}")


@pytest.mark.timeout(120)
def test_a_ddp_script_without_a_launcher_runs_as_one_process(tmp_path):
    """`trainspeed doctor -- train_ddp.py` (and so every tune trial of it, the verify commands
    of a run made under torchrun) runs the script as rank 0 of 1: its env:// rendezvous gets
    the variables torchrun would set, and the doctor says so; plain python fails there."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    plain = subprocess.run([sys.executable, str(SCRIPT)], env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=60)
    assert plain.returncode != 0 and "RANK" in plain.stderr
    out = tmp_path / "doc"
    proc = subprocess.run([sys.executable, "-m", "trainspeed", "doctor", "--steps", "8", "--out", str(out),
                           "--no-html", "--json", "--", str(SCRIPT)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "torch.distributed runs as one process (RANK=0 WORLD_SIZE=1 LOCAL_RANK=0" in proc.stderr
    report = json.loads(proc.stdout)
    assert report["doctor"]["steps"] == 8 and report["summary"]["ranks"] is None
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    launch = [e["data"] for e in events if e["type"] == "observation"
              and e["data"].get("kind") == "one_process_launch"]
    assert len(launch) == 1 and launch[0]["by"] == "torch.distributed"
    assert launch[0]["added_env"]["WORLD_SIZE"] == "1" and "MASTER_PORT" in launch[0]["added_env"]
    # the group the script made is recorded; one rank, measured: no finding about unmeasured ranks
    group = [e["data"] for e in events if e["type"] == "observation" and e["data"].get("kind") == "process_group"]
    assert [(g["world_size"], g["rank"], g["backend"]) for g in group] == [(1, 0, "gloo")]
    assert "unmeasured_ranks" not in [f["id"] for f in report["findings"]]
