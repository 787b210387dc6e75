"""`trainspeed run --with OUT/best.yaml [--doctor --steps N --out DIR] -- python train.py ARGS`

Runs the unchanged script with the settings of a script tune applied at run time (patches
installed before its first line, the script's own flags set on its command line) and nothing
else: no instrumentation unless --doctor asks for it. The user gets the tuned speed before
touching their code; the code change itself is in the tune's code_change.md / best.patch.
The script tuner runs each trial as `run --with TRIAL.yaml --doctor --steps N`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from trainspeed.cli._launchers import is_accelerate
from trainspeed.doctor.launch_forms import is_rank_launcher


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run", help="run an unchanged script with a tune's settings applied (best.yaml)",
        description=("Run a training script with the settings `trainspeed tune -- CMD` found, applied at "
                     "run time; your files are not changed. Example: trainspeed run --with "
                     "runs/tune-train/best.yaml -- python train.py --lr 3e-4"))
    p.add_argument("--with", dest="with_", required=True, metavar="FILE",
                   help="settings file written by a script tune (OUT/best.yaml)")
    p.add_argument("--doctor", action="store_true",
                   help="run under the doctor (phase timing, a run directory and findings)")
    p.add_argument("--steps", type=int, default=0, help="with --doctor: stop after N optimizer steps (0: run to the end)")
    p.add_argument("--warmup-steps", type=int, default=None, help="with --doctor: steps left out of throughput")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="with --doctor: also stop once the run is this old (after its warm-up and 3 steps)")
    p.add_argument("--out", default=None, help="with --doctor: run directory")
    p.add_argument("--quiet", action="store_true", help="with --doctor: print no report (trials)")
    p.add_argument("--no-flops", dest="flops", action="store_false",
                   help="with --doctor: count no FLOPs, so no MFU (a tune's trials, which compare step times)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after `--`")
    p.set_defaults(run=run)


def _own_args(args: argparse.Namespace) -> list[str]:
    """This run's options for the runs a launcher starts, one per process."""
    own = ["run", "--with", str(args.with_)]
    own += [flag for flag, on in (("--doctor", args.doctor), ("--quiet", args.quiet), ("--no-flops", not args.flops))
            if on]
    own += [w for opt, value in (("--steps", args.steps), ("--warmup-steps", args.warmup_steps), ("--out", args.out))
            if value for w in (opt, str(value))]
    return own


def _under_launcher(args: argparse.Namespace, command: list[str]) -> int:
    """`run --with best.yaml -- accelerate launch|torchrun|deepspeed OPTS train.py ARGS`: run goes in under
    the launcher, each process applying the settings to its own script."""
    if is_accelerate(command):
        from trainspeed.cli._launchers import parse_accelerate, relaunch

        return relaunch(parse_accelerate(command), _own_args(args))
    from trainspeed.cli._rank_launch import relaunch_ranks
    from trainspeed.doctor.launch_forms import parse_rank_launch

    return relaunch_ranks(parse_rank_launch(command), _own_args(args))


def resolve_command(plan: Any, command: list[str]) -> list[str]:
    """The command to run: the one given (else the tuned one), with the plan's flags set."""
    from trainspeed.errors import ConfigError
    from trainspeed.patches.plan import apply_flags

    base = command or plan.command
    if not base:
        raise ConfigError("trainspeed run: no command. Usage: trainspeed run --with best.yaml -- python train.py ARGS")
    return apply_flags(base, plan.flags(), plan.flag_styles)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trainspeed.doctor.runner import DoctorConfig, execute, exit_code_of, parse_command, run_doctor
    from trainspeed.patches.plan import load_plan

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    plan = load_plan(args.with_)
    if is_accelerate(command) or is_rank_launcher(command):
        return _under_launcher(args, command)
    typed = command or list(plan.command or [])
    command = resolve_command(plan, command)
    quiet = args.quiet and args.doctor

    def say(text: str) -> None:
        if not quiet:
            print(f"trainspeed run: {text}", file=sys.stderr, flush=True)

    say(applied_line(plan, args.with_))
    if plan.flags():
        say(f"command: {shlex.join(command)}")
    target = parse_command(command)  # a ConfigError before anything is installed
    other = _tuned_for_another(plan, target, typed)
    if other:
        print(f"trainspeed run: warning: {other}", file=sys.stderr, flush=True)
    from trainspeed.startup import preload

    preload()  # what the script and the patches import, with the collector paused: faster
    applied = _install(plan, say)
    result = None
    try:
        if args.doctor:
            config = DoctorConfig(command=command, steps=args.steps or None, out=args.out,
                                  warmup_steps=args.warmup_steps, count_flops=args.flops, sinks=("jsonl",),
                                  max_seconds=args.max_seconds, plan=args.with_ if plan.patch_settings() else None)
            # the system sampler stays on: a tune's trials read other processes' CPU from it
            # (TrialResult.others_load), so a table timed on a busy machine says so
            result = run_doctor(config)
            return result.exit_code
        from trainspeed.doctor.instrument.launch_env import launcher_env_reads

        reads = launcher_env_reads(say)  # a script that reads LOCAL_RANK itself: rank 0 of 1, as its trials ran
        try:
            execute(target)
        except SystemExit as exc:
            return exit_code_of(exc)
        finally:
            reads.undo()
        return 0
    finally:
        applied.uninstall()  # some notes come at uninstall ("no trained module was called")
        if result is not None:
            _write_notes(result.run_dir, plan.settings, applied.notes)
            if not args.quiet:
                from trainspeed.doctor.findings import format_findings

                print(format_findings(result.findings, limit=5))
                print(f"trainspeed run: {result.stopped} after {result.steps} steps; run directory {result.run_dir}")
        else:
            for note in applied.notes:
                say(note)


def _tuned_for_another(plan: Any, target: Any, typed: list[str]) -> str | None:
    """What to say when the plan was tuned on another script than the one run (a newcomer ran the
    demo's best.yaml on word_language_model without a word): its gains were measured there, and
    its settings' call sites are in that file. None for the same script, or one unknown."""
    import os

    tuned = plan.targets.script
    if not tuned or target.kind != "path" or os.path.abspath(target.name) == os.path.abspath(tuned):
        return None
    return (f"these settings were tuned on {tuned}, not {target.name}: their gains were measured there; "
            f"measure them here with trainspeed tune -- {shlex.join(typed)}")


def applied_line(plan: Any, source: str) -> str:
    """Which settings this run applies: each patch setting with its value, each script flag as
    it is written on the command line; or that there are none (a tune where nothing won)."""
    from trainspeed.patches.plan import render_flag, flag_style

    parts = [f"{key}={value}" for key, value in plan.patch_settings().items()]
    parts += [" ".join(render_flag(option, value, flag_style(option, plan.flag_styles, plan.command)))
              or f"{option} off" for option, value in plan.flags().items()]
    if not parts:
        return f"applying no settings from {source} (nothing won): the script runs as it is"
    return f"applying {len(parts)} setting{'s' if len(parts) != 1 else ''} from {source}: {', '.join(parts)}"


class _NothingInstalled:
    notes: list[str] = []

    def uninstall(self) -> None:
        pass


def _install(plan: Any, say: Any) -> Any:
    """Install the plan's patches (a plan of script flags only installs nothing)."""
    if not plan.patch_settings():
        return _NothingInstalled()
    from trainspeed.patches import install_settings

    return install_settings(plan.patch_settings(), plan.targets, say=say)


def _write_notes(run_dir: Any, settings: dict[str, Any], notes: list[str]) -> None:
    """What each patch did (or why it did nothing), beside the run's records: the tuner reads
    it to mark a trial whose setting failed (a compile that fell back to eager)."""
    from trainspeed.fileio import atomic_write_text

    if (run_dir / "patches.json").is_file():  # the training processes' own (doctor/spawned.py)
        return
    atomic_write_text(run_dir / "patches.json", json.dumps({"settings": settings, "notes": notes}, indent=2) + "\n")
