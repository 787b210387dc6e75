"""The doctor under torchrun: every rank instruments the user's unchanged DDP script, rank 0
reports per-rank figures and names the rank that waits for its data."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainspeed.doctor.runner import DoctorConfig, run_doctor
from trainspeed.errors import ConfigError

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
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
         str(_free_port()), "-m", "trainspeed", "doctor", "--steps", "12", "--out", str(out),
         "--no-html", "--", str(SCRIPT)],
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
    found = [f for f in report["findings"] if f["id"] == "straggler"]
    assert len(found) == 1 and "rank 1" in found[0]["title"] and "data wait" in found[0]["evidence"]
