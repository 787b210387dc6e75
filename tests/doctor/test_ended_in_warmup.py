"""A script that ends inside the doctor's warm-up (pytorch/examples' time_sequence_prediction:
its `--steps 2` are two LBFGS steps of 30 s, the warm-up is 5) has no measured step: the report
said "throughput —, step time —" and ranked host syncs first. Now its first finding says why, and
both ways out run as printed: the script's own run-length flag, scaled, or `--warmup-steps 1`."""

from __future__ import annotations

import shlex

import pytest

from trainspeed.cli.main import main as cli_main
from trainspeed.doctor.runner import DoctorConfig, run_doctor

pytestmark = pytest.mark.timeout(120)

SCRIPT = '''
import argparse
import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=15)
args = p.parse_args()
torch.manual_seed(0)
model = nn.Linear(8, 1)
opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
x, y = torch.randn(64, 8), torch.randn(64, 1)
seen = []
for i in range(args.steps):
    def closure():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        seen.append(loss.item())  # a host read every evaluation, as the original prints one
        return loss
    opt.step(closure)
'''


def _finding(result, fid):
    return next((f for f in result.findings if f["id"] == fid), None)


def test_a_script_that_ends_in_the_warmup_is_told_how_to_get_measured_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    result = run_doctor(DoctorConfig(command=["python", "train.py", "--steps", "2"], out=tmp_path / "run",
                                     system_sampler=False))
    assert (result.stopped, result.steps) == ("end", 2)
    first = result.findings[0]
    assert first["id"] == "ended_in_warmup" and first["severity"] == "warning"
    assert "after 2 steps, inside the doctor's 5 warm-up steps" in first["evidence"]
    # the script's --steps, scaled to 5 warm-up (the default for 200 steps) + 3 measured
    assert first["verify_with"] == "trainspeed doctor -- python train.py --steps 8"
    # its reads are counted over all its steps, none of which is steady-state
    assert "(all steps, warm-up included;" in _finding(result, "host_syncs")["evidence"]
    # of 2 steps, one is measured with one warm-up step and no FLOP count (which takes the second)
    assert "trainspeed doctor --warmup-steps 1 --no-flops -- python train.py --steps 2" in first["recommendation"]

    # both commands, as printed, through the CLI
    for command, measured in ((first["verify_with"], 3), ("trainspeed doctor --warmup-steps 1 --no-flops -- "
                                                          "python train.py --steps 2", 1)):
        out = tmp_path / f"after{measured}"
        argv = shlex.split(command)[1:]
        argv[1:1] = ["--out", str(out), "--no-html"]
        assert cli_main(argv) == 0
        import json

        report = json.loads((out / "report.json").read_text())
        assert report["summary"]["measured_steps"] == measured
        assert "ended_in_warmup" not in [f["id"] for f in report["findings"]]
        if measured == 1:  # the warm-up chosen is carried into the commands this run prints
            assert all(" --warmup-steps 1 " in f["verify_with"] for f in report["findings"]
                       if (f.get("verify_with") or "").startswith("trainspeed doctor"))


def test_a_script_without_a_length_flag_is_told_the_warmup_option(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT.replace('p.add_argument("--steps", type=int, default=15)',
                                                      'p.add_argument("--lr", type=float, default=0.5)')
                                       .replace("range(args.steps)", "range(3)"))
    result = run_doctor(DoctorConfig(command=["python", "train.py"], out=tmp_path / "run", system_sampler=False,
                                     steps=40))
    first = result.findings[0]
    assert first["id"] == "ended_in_warmup"
    # 3 steps: the second is the FLOP count's, the third is measured
    assert first["verify_with"] == "trainspeed doctor --steps 40 --warmup-steps 1 -- python train.py"
    assert "at least 7 steps" in first["recommendation"]  # warm-up 4 for 40 steps, + 3 measured
    # a run that measured steps gets no such finding
    enough = run_doctor(DoctorConfig(command=["python", "train.py"], out=tmp_path / "run2", system_sampler=False,
                                     steps=40, warmup_steps=1))
    assert _finding(enough, "ended_in_warmup") is None and enough.steps == 3


def test_a_one_step_script_can_only_be_measured_without_warmup(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT.replace("range(args.steps)", "range(1)"))
    result = run_doctor(DoctorConfig(command=["python", "train.py"], out=tmp_path / "run", system_sampler=False))
    first = result.findings[0]
    assert first["id"] == "ended_in_warmup" and "after 1 step," in first["evidence"]
    # the --steps flag is not what ends it here, but scaling it is still the first way out
    assert "let the doctor warm up for none: trainspeed doctor --warmup-steps 0 --no-flops -- python train.py" \
        in first["recommendation"]
