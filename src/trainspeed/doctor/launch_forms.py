"""The command that runs the doctor inside each rank of a launcher's command, built from the
user's own words: `deepspeed --num_gpus 2 train.py --deepspeed_config ds.json` becomes
`deepspeed --num_gpus 2 --no_local_rank --module trainspeed doctor --out runs/doctor-train-TIME
-- train.py --deepspeed_config ds.json`, runnable as printed (the refusal used to show a form
with N, RUN_DIR and ARGS to fill in). Each launcher's own parser tells its options from the
script's; a command it cannot read gets None (the caller shows the general form)."""

from __future__ import annotations

import os
import shlex
from typing import Callable, Sequence

__all__ = ["rank_form"]


def _split(words: list[str], rest: list[str]) -> list[str]:
    """The launcher options: the words before the script (the last len(rest) + 1 words)."""
    return [w for w in words[: len(words) - len(rest) - 1] if w not in ("-m", "--module")]


def rank_form(argv: Sequence[str], run_dir_for: Callable[[str], str]) -> str | None:
    """`argv` (torchrun or deepspeed, then the script) with the doctor put in under the launcher;
    `run_dir_for(script)`: the run directory the ranks share (--out is required there)."""
    launcher, words = os.path.basename(argv[0]), list(argv[1:])
    try:
        if launcher == "torchrun":
            from torch.distributed.run import get_args_parser

            args = get_args_parser().parse_args(words)
            script = ["python", "-m", args.training_script] if args.module else [args.training_script]
            return shlex.join(["torchrun", *_split(words, args.training_script_args), "-m", "trainspeed", "doctor",
                               "--out", run_dir_for(args.training_script), "--", *script,
                               *args.training_script_args])
        if launcher == "deepspeed":
            from deepspeed.launcher.runner import parse_args

            args = parse_args(words)
            options = _split(words, args.user_args)
            if "--no_local_rank" not in options:  # else --local_rank=N lands among trainspeed's own options
                options.append("--no_local_rank")
            script = ["python", "-m", args.user_script] if args.module else [args.user_script]
            return shlex.join(["deepspeed", *options, "--module", "trainspeed", "doctor", "--out",
                               run_dir_for(args.user_script), "--", *script, *args.user_args])
    except (ImportError, SystemExit, AttributeError):
        return None
    return None
