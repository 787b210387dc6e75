"""The command that resumes a stopped run, as the stop line prints it.

`trainspeed train gpt run.max_steps=100` stopped by Ctrl-C at step 40 prints

    trainspeed: stopped at step 40; checkpoint saved to runs/gpt-20261126-163000/checkpoints/
    step-00000040.pt; resume with trainspeed train gpt run.max_steps=100
    run.name=gpt-20261126-163000 --auto-resume

The same command line, with the run's own name (so the resume writes on into the same run
directory: steps.jsonl continues, no gap) and --auto-resume in place of any --resume it had.
A script that builds a Trainer itself gets the config keys to set instead.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

_RESUME_FLAGS = ("--resume", "--auto-resume", "checkpoint.resume", "checkpoint.auto_resume",
                 "--checkpoint.resume", "--checkpoint.auto_resume")


def _is_trainspeed(argv0: str) -> bool:
    p = Path(argv0)
    return p.name == "trainspeed" or (p.name == "__main__.py" and p.parent.name == "trainspeed")


def resume_command(path: str | os.PathLike, run_name: str | None = None,
                   argv: list[str] | None = None) -> str:
    """The exact command that resumes this run from `path` (see module docstring)."""
    argv = list(sys.argv if argv is None else argv)
    if not argv or not _is_trainspeed(argv[0]):
        name = f" and run.name={run_name}" if run_name else ""
        return f"checkpoint.resume={path} (or checkpoint.auto_resume=true{name}) in the config"
    rest, i = [], 1
    while i < len(argv):
        arg = argv[i]
        key = arg.split("=", 1)[0]
        if key in _RESUME_FLAGS:
            # a flag with its value in the next word (--resume PATH, --checkpoint.resume X)
            if "=" not in arg and key not in ("--auto-resume",) and i + 1 < len(argv) \
                    and not key.startswith("checkpoint."):
                i += 1
        elif key in ("run.name", "--run.name", "--name") and run_name:
            if "=" not in arg:
                i += 1
        else:
            rest.append(arg)
        i += 1
    if run_name:
        rest.append(f"run.name={run_name}")
    rest.append("--auto-resume")
    return " ".join([*_launcher(), *map(shlex.quote, rest)])


def _launcher() -> list[str]:
    """`trainspeed`, or under torchrun the launcher with the same number of processes."""
    world, local = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if world <= 1:
        return ["trainspeed"]
    if world == local:
        return ["torchrun", "--nproc_per_node", str(local), "-m", "trainspeed"]
    return ["torchrun", "<your launcher options>", "-m", "trainspeed"]
