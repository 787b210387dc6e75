"""A script that asks for CUDA on a machine without it (timm's train.py defaults to
`--device cuda`): the crash finding names the script's own flag for the CPU, and its verify
command sets it. This CPU build of torch raises "Torch not compiled with CUDA enabled"."""

from __future__ import annotations

import textwrap

import pytest
import torch

from trainspeed.doctor.runner import DoctorConfig, run_doctor

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(torch.cuda.is_available(), reason="the script must not find CUDA")]

SCRIPT = textwrap.dedent('''
    import argparse
    import torch

    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-accel", action="store_true")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    device = "cpu" if args.no_accel else args.device
    model = torch.nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(args.steps):
        loss = model(torch.randn(8, 4, device=device)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
''')


def _crash(tmp_path, script: str, *args: str) -> dict:
    (tmp_path / "train.py").write_text(script)
    result = run_doctor(DoctorConfig(command=["python", "train.py", *args], steps=10, out=tmp_path / "run",
                                     system_sampler=False))
    assert result.steps == 0
    return result.findings[0]


def test_the_device_flag_is_set_to_the_cpu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = _crash(tmp_path, SCRIPT, "--steps", "20")
    assert f["id"] == "crashed_before_training"
    assert f["recommendation"] == ("this machine has no CUDA device: run on the CPU with the script's flag, "
                                   "--device cpu (now --device cuda)")
    assert f["verify_with"] == "trainspeed doctor --steps 10 -- python train.py --steps 20 --device cpu"


def test_a_switch_off_is_turned_on_and_without_either_the_finding_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    switch_only = SCRIPT.replace('p.add_argument("--device", default="cuda")\n', "").replace(
        'args.device', '"cuda"')
    f = _crash(tmp_path, switch_only)
    assert f["recommendation"].endswith("--no-accel (now --no-accel (off))")
    assert f["verify_with"] == "trainspeed doctor --steps 10 -- python train.py --no-accel"
    (tmp_path / "run").rename(tmp_path / "run-1")
    neither = switch_only.replace('p.add_argument("--no-accel", action="store_true")\n', "").replace(
        'args.no_accel', 'False')
    f = _crash(tmp_path, neither)
    assert f["recommendation"].startswith("this machine has no CUDA device the script can use")
