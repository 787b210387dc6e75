"""Launchers that start a script once per rank (torchrun, DeepSpeed's `deepspeed`), read by
their own parsers, and the command that runs trainspeed inside each rank of one.

The doctor must run inside every rank, so it goes in under the launcher: `torchrun OPTIONS -m
trainspeed doctor ... --out RUN -- python train.py ARGS`, or `deepspeed OPTIONS --no_local_rank
--module trainspeed doctor ...` (rank 0 reports on all ranks; --no_local_rank keeps DeepSpeed's
--local_rank=N out of trainspeed's own options, the script reads LOCAL_RANK from the environment
as DeepSpeed sets it). `trainspeed doctor|run -- torchrun ...` starts that itself
(cli/_rank_launch.py); where a launcher is refused (runner.parse_command), the refusal prints it
built from the user's own words, runnable as printed (it used to show a form with N, RUN_DIR and
ARGS to fill in).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from trainspeed.errors import ConfigError

__all__ = ["RankLaunch", "is_rank_launcher", "is_torchrun", "parse_rank_launch", "rank_form", "relaunch_head",
           "under_launcher"]

_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


@dataclass(kw_only=True, slots=True)
class RankLaunch:
    kind: str
    """"torchrun" or "deepspeed"."""
    options: list[str]
    """The launcher's own options as typed (`--standalone --nproc_per_node 2`), -m/--module out."""
    script: str
    """The script's path, or its module with `module`."""
    module: bool
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
    return RankLaunch(kind=kind, options=options, script=script, module=bool(module),
                      command=[*python, script, *rest], processes=processes, launcher=[*command[:skip], *options])


def under_launcher(launch: RankLaunch, head: Sequence[str], trainspeed_args: Sequence[str],
                   command: Sequence[str]) -> list[str]:
    """`head` (the launcher: as typed, or this interpreter running its module) with its options,
    then trainspeed as the module every rank runs: `... -m trainspeed ARGS -- COMMAND`."""
    if launch.kind == "torchrun":
        return [*head, *launch.options, "-m", "trainspeed", *trainspeed_args, "--", *command]
    options = launch.options if "--no_local_rank" in launch.options else [*launch.options, "--no_local_rank"]
    return [*head, *options, "--module", "trainspeed", *trainspeed_args, "--", *command]


def rank_form(argv: Sequence[str], run_dir_for: Callable[[str], str]) -> str | None:
    """`argv` (torchrun or deepspeed, then the script) with the doctor put in under the launcher;
    `run_dir_for(script)`: the run directory the ranks share (--out is required there). None
    when the launcher's parser cannot read it (the caller shows the general form)."""
    try:
        launch = parse_rank_launch(argv)
    except ConfigError:
        return None
    command = launch.command if launch.module else launch.command[1:]  # `train.py ARGS`, as typed
    return shlex.join(under_launcher(launch, [launch.kind], ["doctor", "--out", run_dir_for(launch.script)],
                                     command))


def relaunch_head(launch: RankLaunch) -> list[str]:
    """The launcher run as a module of this interpreter (its console script may not be on PATH)."""
    return [sys.executable, "-m", "torch.distributed.run" if launch.kind == "torchrun" else "deepspeed.launcher.runner"]
