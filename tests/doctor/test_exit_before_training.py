"""A newcomer's first runs of pytorch/examples' word_language_model: a typo in the script's own
flag (`--epochz 1`: argparse exits 2) or `--help` (exits 0) was reported as "No training step was
found ... ~100% at stake ... add trainspeed.step()", and a `--dry-run` of one iteration as
"gradients never cleared". Now an exit before any training work says so (with argparse's own
message) and a single forward/backward says the run was too short to find a step."""

from __future__ import annotations

import pytest

from doctor_helpers import run_inline

pytestmark = pytest.mark.timeout(120)

ARGPARSE_SCRIPT = '''
import argparse
import torch
p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=1)
args = p.parse_args()
model = torch.nn.Linear(4, 1)
for _ in range(args.epochs * 3):
    model.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
'''


def _run(tmp_path, args, source=ARGPARSE_SCRIPT):
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    (tmp_path / "main.py").write_text(source)
    return run_doctor(DoctorConfig(command=["python", str(tmp_path / "main.py"), *args], steps=20,
                                   out=tmp_path / "run", system_sampler=False))


def test_a_mistyped_script_flag_is_reported_as_the_scripts_own_exit(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = _run(tmp_path, ["--epochz", "1"])
    assert result.exit_code == 2 and result.stopped == "exit"
    first = result.findings[0]
    assert first["id"] == "exited_before_training"
    assert "status 2 before its first training step" in first["evidence"]
    assert "error: unrecognized arguments: --epochz 1" in first["evidence"]
    assert "arguments" in first["recommendation"] and "trainspeed.step()" not in first["recommendation"]
    assert first["impact"] == 0.0
    assert "no_step_found" not in [f["id"] for f in result.findings]


def test_help_is_reported_as_printed_and_exited(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = _run(tmp_path, ["--help"])
    assert result.exit_code == 0
    first = result.findings[0]
    assert first["id"] == "exited_before_training"
    assert "exited with status 0 before its first training step" in first["evidence"]
    assert "trainspeed.step()" not in first["recommendation"]


ONE_ITERATION = '''
import torch
model = torch.nn.Linear(4, 1)
for i in range(5):
    model.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.1)
    break  # --dry-run
'''


def test_a_single_forward_and_backward_is_too_short_not_never_cleared(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_inline(tmp_path, ONE_ITERATION)
    first = result.findings[0]
    assert first["id"] == "no_step_found"
    assert "never cleared" not in first["evidence"]
    assert "ended after one training forward and backward" in first["evidence"]
    assert "run the script longer" in first["recommendation"]
    assert "trainspeed.step()" in first["recommendation"]  # the other way to mark a step stays


def test_a_dry_run_flag_is_named_as_what_stopped_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = "import sys\n" + ONE_ITERATION.replace("    break  # --dry-run", "    if '--dry-run' in sys.argv: break")
    (tmp_path / "main.py").write_text(source)
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    result = run_doctor(DoctorConfig(command=["python", "main.py", "--dry-run"], steps=20, out=tmp_path / "run",
                                     system_sampler=False))
    first = result.findings[0]
    assert "without --dry-run" in first["recommendation"]
    assert first["verify_with"] == "trainspeed doctor -- python main.py"


NEVER_CLEARED = '''
import torch
model = torch.nn.Linear(4, 1)
for i in range(4):
    model(torch.randn(2, 4)).sum().backward()
'''


def test_several_forwards_whose_grads_were_never_cleared_keep_that_diagnosis(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_inline(tmp_path, NEVER_CLEARED)
    first = result.findings[0]
    assert first["id"] == "no_step_found"
    assert "4 training forwards" in first["evidence"] and "never cleared" in first["evidence"]
