"""`make demo` installs what the demo needs and no more; `make test` installs everything (issue #30:
`make demo` spent 2 of its 7 minutes building DeepSpeed's CPU op, and printed "Failed to
initialize NumPy" from a torch imported before numpy was installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")]


def planned(target: str, tmp_path: Path) -> str:
    """The commands `make TARGET` would run for a fresh venv (make -n: nothing is run)."""
    res = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_make_demo_installs_only_what_the_demo_needs(tmp_path):
    demo = planned("demo", tmp_path)
    assert "deepspeed" not in demo.lower() and "build_shm_op" not in demo
    installs = [line for line in demo.splitlines() if "pip install" in line and "-e" in line]
    assert installs and all("dev" not in line and "wandb" not in line for line in installs), installs
    assert "vision" in installs[0] and "report" in installs[0] and "patch" in installs[0]
    assert "source" in demo and "bin/activate" in demo  # how to get `trainspeed` on the PATH after it


def test_make_test_installs_everything_and_numpy_comes_before_torch(tmp_path):
    test = planned("test", tmp_path)
    assert "deepspeed" in test and "pytest" in test and "dev," in test
    lines = test.splitlines()
    numpy = next(i for i, line in enumerate(lines) if "numpy" in line and "pip install" in line)
    torch = next(i for i, line in enumerate(lines) if "import torch" in line)
    assert numpy < torch
