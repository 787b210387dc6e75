"""`trainspeed doctor [--steps N] [--out DIR] [--log-every K] [--json] [--profile-steps A-B] -- python train.py ARGS`
(or `-- accelerate launch|torchrun|deepspeed [OPTIONS] train.py ARGS`)

Runs the unchanged script in-process under instrumentation, writes a run directory and prints
the ranked findings. The exit code is the script's own (0 when stopped after N steps).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from trainspeed.cli._launchers import is_accelerate
from trainspeed.doctor.launch_forms import is_rank_launcher
from trainspeed.doctor.defaults import DEFAULT_STEPS


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="diagnose an unchanged training script: what is slow, and why",
        description=("Run a training script for N optimizer steps under instrumentation and rank what "
                     "makes it slow. Examples: trainspeed doctor -- python train.py --lr 3e-4 ; "
                     "trainspeed doctor --steps 100 -- python -m mypkg.train"),
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help=f"stop after N optimizer steps (default {DEFAULT_STEPS}; 0 = run the script to the end)")
    parser.add_argument("--warmup-steps", type=int, default=None, metavar="N",
                        help="first steps left out of the figures, as they pay one-time costs (default: a tenth "
                             "of --steps, 1 to 5); 1 for a script of few, slow steps")
    parser.add_argument("--out", default=None,
                        help="run directory (default runs/doctor-<script>-<time>); a run it already holds moves "
                             "into its earlier-runs/ folder (the 3 newest are kept)")
    parser.add_argument("--log-every", type=int, default=20, help="steps between flushes of step records")
    parser.add_argument("--json", action="store_true", help="print report.json instead of the text report")
    parser.add_argument("--device", default=None, choices=("cpu", "cuda"),
                        help="phase clock (default: cuda when available)")
    parser.add_argument("--profile-steps", default=None, metavar="START-END",
                        help="write a torch.profiler trace (Chrome/Perfetto JSON) of these steps, e.g. 50-55")
    parser.add_argument("--no-html", action="store_true", help="do not write report.html")
    parser.add_argument("--no-flops", dest="flops", action="store_false",
                        help="count no FLOPs, so no MFU: the counted step runs a compiled model eagerly, which "
                             "needs the memory compilation saved (on a GPU only tried below half its memory)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the training command, after `--`: python train.py ARGS")
    parser.set_defaults(run=run)


def _print_text(result: Any, *, html: bool) -> None:
    try:
        from trainspeed.report import render_run  # type: ignore[attr-defined]
    except ImportError:
        render_run = None
    if render_run is not None:
        try:
            render_run(result.run_dir, html=html, report=None if result.report_written else result.report)
            return
        except OSError as exc:  # report.html on a full disk: the terminal report is printed
            print(f"trainspeed doctor: report.html not written: {exc.strerror or exc}", file=sys.stderr)
            return
        except Exception as exc:  # noqa: BLE001 - the findings are printed below instead
            print(f"trainspeed doctor: report rendering failed ({type(exc).__name__}: {exc})", file=sys.stderr)
    from trainspeed.doctor.findings import format_findings

    print(format_findings(result.findings, limit=10))


def _own_args(args: argparse.Namespace, command: list[str]) -> list[str]:
    """This doctor's options for the doctors a launcher starts, --out named (all ranks write
    into one run directory; the script's default one, as without the launcher)."""
    from trainspeed.doctor.runner import default_run_dir, parse_command

    out = args.out or str(default_run_dir(parse_command(command)))
    own = ["doctor", "--steps", str(args.steps), "--log-every", str(args.log_every), "--out", out]
    own += [flag for flag, on in (("--json", args.json), ("--no-html", args.no_html), ("--no-flops", not args.flops))
            if on]
    own += [w for opt, value in (("--device", args.device), ("--profile-steps", args.profile_steps),
                                 ("--warmup-steps", args.warmup_steps))
            if value is not None for w in (opt, str(value))]
    return own


def _under_accelerate(args: argparse.Namespace, command: list[str]) -> int:
    """`doctor -- accelerate launch OPTS train.py ARGS`: the doctor goes in under the launcher,
    one doctor per process into one run directory (rank 0 reports), as under torchrun."""
    from trainspeed.cli._launchers import parse_accelerate, relaunch

    launch = parse_accelerate(command)
    return relaunch(launch, _own_args(args, launch.command))


def _under_rank_launcher(args: argparse.Namespace, command: list[str]) -> int:
    """`doctor -- torchrun|deepspeed OPTS train.py ARGS`: likewise (cli/_rank_launch.py)."""
    from trainspeed.cli._rank_launch import relaunch_ranks
    from trainspeed.doctor.launch_forms import parse_rank_launch

    launch = parse_rank_launch(command)
    return relaunch_ranks(launch, _own_args(args, launch.command))


def run(args: argparse.Namespace) -> int:
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if is_accelerate(command):
        return _under_accelerate(args, command)
    if is_rank_launcher(command):
        return _under_rank_launcher(args, command)
    config = DoctorConfig(command=command, steps=args.steps or None, out=args.out,
                          log_every=args.log_every, device=args.device, profile_steps=args.profile_steps,
                          count_flops=args.flops, warmup_steps=args.warmup_steps)
    result = run_doctor(config)
    if int(os.environ.get("RANK", 0)) > 0:  # under torchrun rank 0 prints the report for all ranks
        return result.exit_code
    try:
        _report(args, result)
        if result.unwritable:
            print(_cut_short(result), file=sys.stderr)
        sys.stdout.flush()
    except OSError:
        # stdout gone (a terminal closed by SIGHUP) or on the full disk: the run directory holds
        # what it could, and the exit code stays the script's
        pass
    return result.exit_code


def _report(args: argparse.Namespace, result: Any) -> None:
    if args.json:
        if result.report_written:
            report = (result.run_dir / "report.json").read_text(encoding="utf-8")
        else:  # a full disk: report.json was not written, and `--json | jq` still gets the report
            import json

            from trainspeed.telemetry import schema

            report = json.dumps(schema.sanitize_any(result.report or {}), indent=2)
        sys.stdout.write(report if report.endswith("\n") else report + "\n")
        return
    _print_text(result, html=not args.no_html)
    written = " (report written)" if result.report_written else ""
    how = {"steps": f"stopped after {result.steps} steps", "end": f"script finished ({result.steps} steps)",
           "exit": f"script exited with status {result.exit_code} after {result.steps} steps",
           "crash": f"script crashed after {result.steps} steps (traceback in report.json)",
           "interrupt": "interrupted",
           "signal": f"stopped by a signal after {result.steps} steps{written}"}.get(result.stopped, result.stopped)
    print(f"trainspeed doctor: {how}; run directory {result.run_dir}")


def _cut_short(result: Any) -> str:
    """The run directory could not be written (a full disk): what it lacks and what to do. Said
    at the end, where it is read; the warning when it happened scrolled away long before."""
    from trainspeed.telemetry.rundir import last_recorded_step

    last = last_recorded_step(result.run_dir)
    kept = f"its step records stop at step {last}" if last else "it holds no step records"
    lost = "" if result.report_written else "; report.json was not written"
    return (f"trainspeed doctor: the run directory {result.run_dir} could not be written ({result.unwritable}): "
            f"{kept}{lost}. Training went on after that (exit code {result.exit_code}); the report covers the steps "
            "recorded. Free space there, then run the doctor again for a complete run directory")
