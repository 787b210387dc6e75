"""`accelerate launch [options] train.py ARGS` as the doctor, the tuner and `run --with` take it.

Hugging Face's launcher starts the script once per process with its own environment (the
mixed precision, the CPU flag, torchrun's RANK/WORLD_SIZE for several processes). The doctor and
`run --with` go in under it: `accelerate launch OPTIONS -m trainspeed doctor ... -- python
train.py ARGS`, so every process is observed the way `torchrun -m trainspeed doctor` observes
it (rank 0 reports on all ranks). A tune's trials are one process each: a one-process launch is
tuned as the script with the environment accelerate would give it; several processes are refused
with the one-process command, as for torchrun.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Sequence

from trainspeed.doctor.command_words import one_process_launch
from trainspeed.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class AccelerateLaunch:
    options: list[str]
    """accelerate launch's own options (`--num_processes 2 --mixed_precision bf16`), --module taken out."""
    command: list[str]
    """The script's one-process command: `python train.py ARGS` or `python -m pkg.train ARGS`."""
    processes: int
    """Processes accelerate starts (1 unless --num_processes / --multi_gpu say more)."""
    env: dict[str, str] = field(default_factory=dict)
    """What accelerate's one-process launcher adds to the environment (ACCELERATE_*)."""
    launcher: list[str] = field(default_factory=list)
    """The words before the script as typed (`accelerate launch --num_processes 2`, --module
    out: it stays in `command`): verify commands put them back in front of the script."""


def is_accelerate(command: Sequence[str]) -> bool:
    return len(command) >= 2 and os.path.basename(command[0]) == "accelerate" and command[1] == "launch"


def parse_accelerate(command: Sequence[str]) -> AccelerateLaunch:
    """The parts of `accelerate launch OPTIONS SCRIPT ARGS`, read by accelerate's own parser."""
    try:
        from accelerate.commands.launch import launch_command_parser
    except ImportError:
        raise ConfigError("the command starts with `accelerate launch`, but accelerate is not installed here: "
                          "pip install accelerate (or trainspeed[hf])") from None
    words = list(command[2:])
    parser = launch_command_parser()
    try:
        args = parser.parse_args(words)
    except SystemExit:
        raise ConfigError(f"accelerate launch could not read its options: {' '.join(words)}") from None
    if args.no_python:
        raise ConfigError("accelerate launch --no_python runs no Python script; the doctor needs one: "
                          "leave --no_python out")
    script_at = len(words) - len(args.training_script_args) - 1
    options = [w for w in words[:script_at] if w not in ("-m", "--module")]
    python = ["python", "-m"] if args.module else ["python"]  # read by the doctor, run in its process
    command_ = [*python, args.training_script, *args.training_script_args]
    processes = _processes(parser.parse_args(words))
    return AccelerateLaunch(options=options, command=command_, processes=processes,
                            env=_one_process_env(args) if processes <= 1 else {},
                            launcher=[command[0], command[1], *options])


def _processes(args) -> int:
    """The processes accelerate will start, as its launch_command decides: several only through
    a multi-process launcher (--multi_gpu, set by accelerate itself on a machine with several
    GPUs; DeepSpeed, FSDP, Megatron) and never with --cpu. `--num_processes 2 --cpu` runs one
    process (the simple launcher): it was announced as 2, and its tune refused."""
    import logging

    from accelerate.commands.launch import _validate_launch_command

    quiet = logging.getLogger("accelerate.commands.launch")
    level, quiet.level = quiet.level, logging.ERROR  # its "values were not passed" notice: accelerate prints it
    try:
        args, _, _ = _validate_launch_command(args)
    except ValueError as exc:
        raise ConfigError(f"accelerate launch refuses these options: {exc}") from None
    finally:
        quiet.setLevel(level)
    several = (args.use_deepspeed or args.use_fsdp or getattr(args, "use_megatron_lm", False)
               or args.multi_gpu) and not args.cpu
    return max(1, int(args.num_processes or 1)) if several else 1


def _one_process_env(args) -> dict[str, str]:
    """The variables accelerate's simple launcher sets (it validates the options first)."""
    from accelerate.commands.launch import _validate_launch_command
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    args, _, _ = _validate_launch_command(args)
    _, env = prepare_simple_launcher_cmd_env(args)
    return {k: v for k, v in env.items() if os.environ.get(k) != v}


def one_process(command: Sequence[str], what: str) -> list[str]:
    """The one-process command of a launch for a tune's trials, its environment set in this
    process (the trials inherit it); several processes are refused, as for torchrun."""
    launch = parse_accelerate(command)
    if launch.processes > 1:
        one = shlex.join([*one_process_launch(launch.launcher), *launch.command[1:]])
        raise ConfigError(f"trainspeed {what}: accelerate starts {launch.processes} processes, and each trial would "
                          f"need its own launcher; tune one process of it: trainspeed tune -- {one}")
    os.environ.update(launch.env)
    return list(launch.command)


def relaunch(launch: AccelerateLaunch, trainspeed_args: Sequence[str]) -> int:
    """Run `accelerate launch OPTIONS -m trainspeed ARGS -- COMMAND`; its exit status."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *launch.options, "-m", "trainspeed",
           *trainspeed_args, "--", *launch.command]
    print(f"trainspeed: under accelerate ({launch.processes} process{'es' if launch.processes > 1 else ''}): "
          f"accelerate launch {' '.join(launch.options)} -m trainspeed {' '.join(trainspeed_args)} -- "
          f"{' '.join(launch.command[1:])}", file=sys.stderr, flush=True)
    return run_under_launcher(cmd, launch.launcher)


def run_under_launcher(cmd: Sequence[str], launcher: Sequence[str]) -> int:
    """Run a launcher command that starts trainspeed in each process (accelerate's, torchrun's,
    DeepSpeed's), each importing this trainspeed and told the launcher words the user typed
    (runner.LAUNCHER_ENV: verify commands give them back); its exit status."""
    import json

    from trainspeed.doctor.instrument.import_path import TRAINSPEED_ROOT
    from trainspeed.doctor.instrument.run_env import PARENT_ENV, carried_env
    from trainspeed.doctor.runner import LAUNCHER_ENV

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TRAINSPEED_ROOT, os.environ.get("PYTHONPATH")])),
           LAUNCHER_ENV: json.dumps(list(launcher)),
           PARENT_ENV: json.dumps(carried_env())}  # the user's, before the launcher adds its own
    return wait_for_launcher(cmd, env)


def wait_for_launcher(cmd: Sequence[str], env: dict[str, str]) -> int:
    """Run the launcher that starts a doctor in each process, and wait for it to end; its exit
    status. A SIGTERM sent to this process (`timeout`, a scheduler that signals one process) goes
    on to the launcher, which stops its ranks and lets them write their reports; before, this
    process died and left the launcher and its ranks running to --steps without it. Ctrl-C at a
    terminal reaches the launcher directly (one process group): here it is only waited out, where
    subprocess.run SIGKILLed the launcher 0.25 s in, while its ranks were still writing."""
    import signal

    proc = subprocess.Popen(list(cmd), env=env)

    def forward(signum: int, frame) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, forward),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    try:
        return proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


__all__ = ["AccelerateLaunch", "is_accelerate", "one_process", "parse_accelerate", "relaunch", "run_under_launcher",
           "wait_for_launcher"]
