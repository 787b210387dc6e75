"""The batch scheduler a run is under, as env.json records it: SLURM's job id and restart count.

Read from the environment only (no scheduler command runs here). The Trainer continues the run
a restarted job began by this record (engine/checkpoint/slurm.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


def job_id(env: Mapping[str, str] | None = None) -> str | None:
    """The id `scontrol requeue` takes for this job: ARRAYJOB_TASK for an array task, else
    SLURM_JOB_ID; None outside SLURM (or an id of another form: not one to pass to a command)."""
    env = os.environ if env is None else env
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    job = f"{array}_{task}" if array and task else env.get("SLURM_JOB_ID")
    return job if job and _JOB_ID.match(job) else None


def restart_count(env: Mapping[str, str] | None = None) -> int:
    """How many times SLURM started this job again (SLURM_RESTART_COUNT; 0 on its first start)."""
    env = os.environ if env is None else env
    try:
        return max(0, int(env.get("SLURM_RESTART_COUNT") or 0))
    except ValueError:
        return 0


def env_record(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """What env.json keeps of the job: {"job_id", "restart"}; None outside SLURM."""
    job = job_id(env)
    return {"job_id": job, "restart": restart_count(env)} if job else None


__all__ = ["env_record", "job_id", "restart_count"]
