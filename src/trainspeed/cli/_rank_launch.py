"""`trainspeed doctor|run -- torchrun|deepspeed [options] train.py ARGS`, as they take
`accelerate launch`: trainspeed goes in under the launcher, one per rank (the launchers' parsing
and forms: doctor/launch_forms.py). The user types the command they already run; the report's
verify commands give it back in that form (the launcher words are recorded,
runner.LAUNCHER_ENV). Before, this was refused with a form to retype by hand.
"""

from __future__ import annotations

import sys
from typing import Sequence

from trainspeed.doctor.launch_forms import RankLaunch, relaunch_head, under_launcher

__all__ = ["relaunch_ranks"]


def relaunch_ranks(launch: RankLaunch, trainspeed_args: Sequence[str]) -> int:
    """Run `torchrun OPTIONS -m trainspeed ARGS -- COMMAND` (or DeepSpeed's form); its exit status."""
    from trainspeed.cli._launchers import run_under_launcher

    cmd = under_launcher(launch, relaunch_head(launch), trainspeed_args, launch.command)
    per_node = f" ({launch.processes} per node)" if launch.processes else ""
    print(f"trainspeed: under {launch.kind}{per_node}: {launch.kind} {' '.join(cmd[3:])}",
          file=sys.stderr, flush=True)
    return run_under_launcher(cmd, launch.launcher)
