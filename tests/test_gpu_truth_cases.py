"""benchmarks/gpu_truth.py's cases are runnable as declared (no GPU needed): each script exists,
each expected finding id is one a check can produce, each knob is a script-tune knob, and
gpu_check.sh parses."""
from __future__ import annotations

import inspect
import subprocess
from pathlib import Path

import pytest
from benchmark_module import load_benchmark

from trainspeed.doctor.checks import CHECKS
from trainspeed.tune.script_knobs import SCRIPT_KNOBS

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[1]


def _truth():
    return load_benchmark("gpu_truth")


def test_cases_name_existing_scripts_findings_and_knobs():
    truth = _truth()
    sources = "".join(inspect.getsource(check) for check in CHECKS)
    assert len(truth.CASES) >= 8 and any(not c.expect for c in truth.CASES.values())
    for name, case in truth.CASES.items():
        assert (truth.SCRIPTS / case.script).is_file(), name
        for finding in case.expect:
            assert f'id="{finding}"' in sources or f"'{finding}'" in sources, (name, finding)
        if case.expect:
            assert case.knob in SCRIPT_KNOBS, name  # every planted cause has a knob that fixes it


def test_gpu_check_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_check.sh")]).returncode == 0
