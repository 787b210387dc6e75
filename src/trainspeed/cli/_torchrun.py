"""`trainspeed doctor -- torchrun [options] train.py ARGS` (and `run --with`), as they take
`accelerate launch`.

torchrun starts the script once per rank; the doctor must run inside each rank, so it goes in
under the launcher: `torchrun OPTIONS -m trainspeed doctor ... --out RUN -- python train.py ARGS`
(rank 0 reports on all ranks). The user types the command they already run; the report's verify
commands give it back in that form (the launcher words are recorded, runner.LAUNCHER_ENV).
Before, this was refused with a form to retype by hand, its N, RUN_DIR and ARGS left for the user
to fill in.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Sequence

from trainspeed.errors import ConfigError

__all__ = ["TorchrunLaunch", "is_torchrun", "parse_torchrun"]

_MODULE = ("torch.distributed.run", "torch.distributed.launch")


@dataclass(kw_only=True, slots=True)
class TorchrunLaunch:
    options: list[str]
    """torchrun's own options as typed (`--standalone --nproc_per_node 2`), -m/--module out."""
    command: list[str]
    """The script's one-process command: `python train.py ARGS` or `python -m pkg.train ARGS`."""
    processes: str
    """--nproc_per_node as given (a number, or torchrun's "auto", "cpu", "gpu")."""
    launcher: list[str]
    """The words before the script as typed (`torchrun --standalone --nproc_per_node 2`)."""


def _launcher_words(command: Sequence[str]) -> int:
    """How many words name the launcher: 1 for `torchrun`, 3 for `python -m torch.distributed.run`."""
    if command and os.path.basename(command[0]) == "torchrun":
        return 1
    if len(command) >= 3 and command[1] == "-m" and command[2] in _MODULE and "python" in os.path.basename(command[0]):
        return 3
    return 0


def is_torchrun(command: Sequence[str]) -> bool:
    return _launcher_words(command) > 0


def parse_torchrun(command: Sequence[str]) -> TorchrunLaunch:
    """The parts of `torchrun OPTIONS SCRIPT ARGS`, read by torchrun's own parser."""
    from torch.distributed.run import get_args_parser

    skip = _launcher_words(command)
    words = list(command[skip:])
    try:
        args = get_args_parser().parse_args(words)
    except SystemExit:
        raise ConfigError(f"torchrun could not read its options: {' '.join(words)}") from None
    if args.no_python:
        raise ConfigError("torchrun --no-python runs no Python script; the doctor needs one: leave --no-python out")
    script_at = len(words) - len(args.training_script_args) - 1
    options = [w for w in words[:script_at] if w not in ("-m", "--module")]
    python = ["python", "-m"] if args.module else ["python"]
    return TorchrunLaunch(options=options, command=[*python, args.training_script, *args.training_script_args],
                          processes=str(args.nproc_per_node), launcher=[*command[:skip], *options])


def relaunch_torchrun(launch: TorchrunLaunch, trainspeed_args: Sequence[str]) -> int:
    """Run `torchrun OPTIONS -m trainspeed ARGS -- COMMAND`; its exit status."""
    import json

    from trainspeed.cli._launchers import our_root, wait_for_launcher
    from trainspeed.doctor.runner import LAUNCHER_ENV

    cmd = [sys.executable, "-m", "torch.distributed.run", *launch.options, "-m", "trainspeed",
           *trainspeed_args, "--", *launch.command]
    print(f"trainspeed: under torchrun ({launch.processes} per node): torchrun {' '.join(launch.options)} "
          f"-m trainspeed {' '.join(trainspeed_args)} -- {' '.join(launch.command)}", file=sys.stderr, flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [our_root(), os.environ.get("PYTHONPATH")])),
           LAUNCHER_ENV: json.dumps(launch.launcher)}
    return wait_for_launcher(cmd, env)
