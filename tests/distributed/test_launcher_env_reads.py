"""A script that reads the launcher's variables itself (Lightning's
examples/fabric/reinforcement_learning/train_torch.py: `local_rank = int(os.environ["LOCAL_RANK"])`
before its init_process_group), doctored without a launcher, runs as rank 0 of 1. Run under
torchrun, the doctor names `trainspeed tune -- python train_torch.py` (a tune's trials are one
process), whose baseline trial died at once: "KeyError: 'LOCAL_RANK'". A script that only asks
whether it was launched (nanoGPT's `os.environ.get("RANK", -1)`) is still told it was not."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
import os
import torch
import torch.distributed as dist
from torch import nn

launched = int(os.environ.get("RANK", -1)) != -1 or "WORLD_SIZE" in os.environ  # asks only
local_rank = int(os.environ["LOCAL_RANK"])  # needs a launcher
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print(f"launched={launched} local_rank={local_rank} rank={rank} world={world}")
dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
"""


def test_a_script_reading_local_rank_itself_runs_as_rank_0_of_1(tmp_path):
    script = tmp_path / "train_torch.py"
    script.write_text(SCRIPT)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "doc"
    proc = subprocess.run([sys.executable, "-m", "trainspeed", "doctor", "--steps", "8", "--out", str(out),
                           "--no-html", "--json", "--", "python", str(script)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the .get() and `in` before it saw no launcher; the subscript got rank 0 of 1
    assert "launched=False local_rank=0 rank=0 world=1" in proc.stdout + proc.stderr
    assert "the script (it reads os.environ['LOCAL_RANK']) runs as one process (RANK=0" in proc.stderr
    assert json.loads(proc.stdout[proc.stdout.index("{"):])["doctor"]["steps"] == 8
    assert "RANK" not in os.environ  # nothing left behind in this process either


def test_run_with_a_tunes_settings_runs_it_as_its_trials_did(tmp_path):
    """`trainspeed run --with best.yaml -- python train_torch.py`, the line a tune of that
    command prints, ran the script without the one-process environment its trials had."""
    script = tmp_path / "train_torch.py"
    script.write_text(SCRIPT)
    plan = tmp_path / "best.yaml"
    plan.write_text(f"schema: 1\nkind: script-settings\ncommand:\n- python\n- {script}\nsettings:\n  threads: 1\n")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    env.update(PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "trainspeed", "run", "--with", str(plan), "--", "python", str(script)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "launched=False local_rank=0 rank=0 world=1" in proc.stdout
    assert "the script (it reads os.environ['LOCAL_RANK']) runs as one process" in proc.stderr
