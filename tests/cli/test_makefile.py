"""`make demo` installs what the demo needs and no more; `make test` installs everything (issue #30:
`make demo` spent 2 of its 7 minutes building DeepSpeed's CPU op, and printed "Failed to
initialize NumPy" from a torch imported before numpy was installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")]


def planned(target: str, tmp_path: Path, *variables: str) -> str:
    """The commands `make TARGET` would run for a fresh venv (make -n: nothing is run)."""
    # CI's own CI=true (.ci/run) must not reach the plan, nor `make test-all`'s TEST_SCOPE= (make
    # exports a command-line variable to its recipes' environment, and in MAKEFLAGS to the makes
    # below them): a test asks for each as a variable
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TEST_SCOPE", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    res = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}", *variables], cwd=ROOT,
                         capture_output=True, text=True, timeout=30, env=env)
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


def _pytest_runs(plan: str) -> list[str]:
    return [line for line in plan.splitlines() if "-m pytest" in line]


@pytest.mark.parametrize("variables,leaves_out_slow", [((), True), (("CI=true",), False), (("CI=false",), True)])
def test_make_test_leaves_out_the_slow_tests_except_in_ci(tmp_path, variables, leaves_out_slow):
    """`make test` is the quick gate (the suite took 8-10 minutes on 2 cores, 518 of its 916
    test-seconds in `slow` end-to-end runs); CI, which runs `make test` with CI=true, runs all."""
    runs = _pytest_runs(planned("test", tmp_path, *variables))
    assert len(runs) == 2 and all(("and not slow" in run) is leaves_out_slow for run in runs), runs


def test_make_test_all_runs_every_test(tmp_path):
    runs = _pytest_runs(planned("test-all", tmp_path))
    assert len(runs) == 2 and not any("slow" in run for run in runs), runs
