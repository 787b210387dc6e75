"""SLURM's preemption warning: save, requeue the job, and continue the run when it starts again.

A job submitted with `sbatch --signal=USR1@90` gets SIGUSR1 90 s before its time limit (or its
preemption). SIGUSR1's default action ends the process at once: every step since the last
periodic checkpoint was lost, and the job ended for good. The Trainer takes SIGUSR1 where its
action is the default (emergency.py): it saves at the next step boundary, as for SIGTERM; then the
writer rank requeues the job (`scontrol requeue JOB`, as Lightning's SLURM auto-requeue does, an
array task as ARRAYJOB_TASK) and the process leaves. SLURM starts the requeued job with the same
command and SLURM_RESTART_COUNT >= 1; env.json records the job id of every run
(telemetry/env.py), so that start continues the run this job began (setup.run_dir_for) from its
newest checkpoint, whether or not its command said --auto-resume. A job SLURM itself requeued
(a node failure, `--requeue`) continues the same way from its last periodic checkpoint.

Only the job id and restart count are read from the environment; nothing here runs unless
SLURM_JOB_ID is set.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from trainspeed.telemetry.scheduler import job_id, restart_count

REQUEUE_SIGNAL = "SIGUSR1"
"""The signal whose save requeues the job (sbatch --signal=USR1@SECONDS)."""


def requeue(job: str, run: Any = subprocess.run) -> str | None:
    """Requeue `job` with scontrol; None when done, else why not (a line to show the user)."""
    try:
        done = run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        return "scontrol is not on this node's PATH"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scontrol failed: {exc}"
    if done.returncode != 0:
        said = (done.stderr or done.stdout or "").strip().splitlines()
        return f"scontrol requeue {job} exited with {done.returncode}" + (f": {said[-1]}" if said else "")
    return None


def run_of_job(out_dir: Path, job: str) -> Path | None:
    """The newest run directory under `out_dir` whose env.json names `job`: the run a restarted
    job continues."""
    import json

    found: list[tuple[float, Path]] = []
    try:
        candidates = [p for p in out_dir.iterdir() if p.is_dir()]
    except OSError:
        return None
    for path in candidates:
        try:
            env = json.loads((path / "env.json").read_text())
        except (OSError, ValueError):
            continue
        slurm = env.get("slurm") if isinstance(env, dict) else None
        if isinstance(slurm, dict) and slurm.get("job_id") == job:
            found.append((path.stat().st_mtime, path))
    return max(found)[1] if found else None


__all__ = ["REQUEUE_SIGNAL", "job_id", "requeue", "restart_count", "run_of_job"]
