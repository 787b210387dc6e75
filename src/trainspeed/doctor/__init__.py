"""The doctor: diagnose an unchanged training script.

    trainspeed doctor --steps 200 -- python train.py ARGS

runs the script in-process under instrumentation (instrument/), writes a run directory and
ranks findings (checks/). `diagnose(read_run(path))` re-runs the checks on any run directory.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DoctorConfig", "DoctorResult", "run_doctor", "diagnose", "Finding"]


def __getattr__(name: str) -> Any:
    if name in ("DoctorConfig", "DoctorResult", "run_doctor"):
        from trainspeed.doctor import runner

        return getattr(runner, name)
    if name == "diagnose":
        from trainspeed.doctor.checks import diagnose

        return diagnose
    if name == "Finding":
        from trainspeed.doctor.findings import Finding

        return Finding
    raise AttributeError(f"module 'trainspeed.doctor' has no attribute {name!r}")
