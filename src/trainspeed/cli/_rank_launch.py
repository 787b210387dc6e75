"""`trainspeed doctor -- torchrun|deepspeed [options] train.py ARGS` (and `run --with`), as they
take `accelerate launch`.

Both launchers start the script once per rank; the doctor must run inside each rank, so it goes
in under the launcher: `torchrun OPTIONS -m trainspeed doctor ... --out RUN -- python train.py
ARGS`, or `deepspeed OPTIONS --no_local_rank --module trainspeed doctor ...` (rank 0 reports on
all ranks; --no_local_rank keeps DeepSpeed's --local_rank=N out of trainspeed's own options, the
script reads LOCAL_RANK from the environment as DeepSpeed sets it). The user types the command
they already run; the report's verify commands give it back in that form (the launcher words
are recorded, runner.LAUNCHER_ENV). Before, this was refused with a form to retype by hand.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Sequence

from trainspeed.errors import ConfigError

__all__ = ["RankLaunch", "is_rank_launcher", "is_torchrun", "parse_rank_launch", "relaunch_ranks"]

_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


@dataclass(kw_only=True, slots=True)
class RankLaunch:
    kind: str
    """"torchrun" or "deepspeed"."""
    options: list[str]
    """The launcher's own options as typed (`--standalone --nproc_per_node 2`), -m/--module out."""
    command: list[str]
    """The script's one-process command: `python train.py ARGS` or `python -m pkg.train ARGS`."""
    processes: str
    """Processes per node as given (torchrun's --nproc_per_node, DeepSpeed's --num_gpus; "" if not)."""
    launcher: list[str]
    """The words before the script as typed (`torchrun --standalone --nproc_per_node 2`)."""


def _launcher_words(command: Sequence[str]) -> tuple[str, int]:
    """(kind, how many words name the launcher): `torchrun` 1, `python -m torch.distributed.run` 3,
    `deepspeed` 1; ("", 0) for anything else."""
    if not command:
        return "", 0
    name = os.path.basename(command[0])
    if name in ("torchrun", "deepspeed"):
        return name, 1
    if len(command) >= 3 and command[1] == "-m" and command[2] in _TORCHRUN_MODULES and "python" in name:
        return "torchrun", 3
    return "", 0


def is_rank_launcher(command: Sequence[str]) -> bool:
    return _launcher_words(command)[1] > 0


def is_torchrun(command: Sequence[str]) -> bool:
    return _launcher_words(command)[0] == "torchrun"


def parse_rank_launch(command: Sequence[str]) -> RankLaunch:
    """The parts of `torchrun|deepspeed OPTIONS SCRIPT ARGS`, read by the launcher's own parser."""
    kind, skip = _launcher_words(command)
    words = list(command[skip:])
    try:
        if kind == "torchrun":
            from torch.distributed.run import get_args_parser

            args = get_args_parser().parse_args(words)
            script, rest, module, processes = (args.training_script, args.training_script_args, args.module,
                                               str(args.nproc_per_node))
        else:
            try:
                from deepspeed.launcher.runner import parse_args
            except ImportError:
                raise ConfigError("the command starts with `deepspeed`, but DeepSpeed is not installed here: "
                                  "pip install deepspeed") from None
            args = parse_args(words)
            script, rest, module = args.user_script, args.user_args, args.module
            processes = str(args.num_gpus) if args.num_gpus not in (None, -1) else ""
    except SystemExit:
        raise ConfigError(f"{kind} could not read its options: {' '.join(words)}") from None
    if getattr(args, "no_python", False):
        raise ConfigError(f"{kind} --no-python runs no Python script; the doctor needs one: leave --no-python out")
    options = [w for w in words[: len(words) - len(rest) - 1] if w not in ("-m", "--module")]
    python = ["python", "-m"] if module else ["python"]
    return RankLaunch(kind=kind, options=options, command=[*python, script, *rest], processes=processes,
                      launcher=[*command[:skip], *options])


def relaunch_ranks(launch: RankLaunch, trainspeed_args: Sequence[str]) -> int:
    """Run `torchrun OPTIONS -m trainspeed ARGS -- COMMAND` (or DeepSpeed's form); its exit status."""
    import json

    from trainspeed.cli._launchers import our_root, wait_for_launcher
    from trainspeed.doctor.runner import LAUNCHER_ENV

    if launch.kind == "torchrun":
        head = [sys.executable, "-m", "torch.distributed.run", *launch.options, "-m", "trainspeed"]
    else:
        options = launch.options if "--no_local_rank" in launch.options else [*launch.options, "--no_local_rank"]
        head = [sys.executable, "-m", "deepspeed.launcher.runner", *options, "--module", "trainspeed"]
    cmd = [*head, *trainspeed_args, "--", *launch.command]
    per_node = f" ({launch.processes} per node)" if launch.processes else ""
    print(f"trainspeed: under {launch.kind}{per_node}: {launch.kind} {' '.join(head[3:])} "
          f"{' '.join(trainspeed_args)} -- {' '.join(launch.command)}", file=sys.stderr, flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [our_root(), os.environ.get("PYTHONPATH")])),
           LAUNCHER_ENV: json.dumps(launch.launcher)}
    return wait_for_launcher(cmd, env)
