"""A finding's `verify` command must run as written for the user: their script, their flags."""

from __future__ import annotations

import shlex
import sys

import pytest

from trainspeed.doctor.runner import DoctorConfig, run_doctor

pytestmark = pytest.mark.timeout(120)

SCRIPT = '''
import argparse, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=0.1)
args = p.parse_args()


class Slow(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(8), i % 2


loader = DataLoader(Slow(), batch_size=4)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


def test_script_findings_verify_with_the_script_tune_of_the_recorded_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    command = ["python", "train.py", "--lr", "0.05"]
    result = run_doctor(DoctorConfig(command=command, steps=12, out=tmp_path / "run", system_sampler=False))
    data = next(f for f in result.findings if f["id"].startswith("data"))
    assert data["verify_with"] == "trainspeed tune --knobs num_workers -- python train.py --lr 0.05"
    # what the CLI will do with it: a script tune of exactly that command
    from trainspeed.cli.main import build_parser
    from trainspeed.cli.tune import is_script_command

    args = build_parser().parse_args(shlex.split(data["verify_with"])[1:])
    assert is_script_command(args.target) and [args.target, *args.rest] == command and args.knobs == "num_workers"
    for finding in result.findings:
        assert "<your command>" not in (finding.get("verify_with") or "")
        assert "CONFIG.yaml" not in (finding.get("verify_with") or "")
    # the doctor saw where the loader, the optimizer and the model call are, and the flags
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert '"site":"train.py:21"' in events and '"site":"train.py:23"' in events
    assert '"call_site":"train.py:25"' in events and '"option":"--lr"' in events
    assert sys.argv[0] != "train.py"  # the script's argv was restored
