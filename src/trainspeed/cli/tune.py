"""`trainspeed tune CONFIG.yaml|RECIPE [--budget 10m] [--knobs a,b] [--out DIR] [overrides]`"""

from __future__ import annotations

import argparse
import contextlib
import math

from trainspeed.cli._args import duration
from trainspeed.cli._launchers import is_accelerate, one_process
from trainspeed.tune.budget_plan import NOTHING_MEASURED  # exit status 3: a tune that measured nothing
from trainspeed.tune.options import TuneOptions
from trainspeed.tune.knob_types import DEFAULT_WARMUP, MIN_EFFECT

HELP = """Measure every speed switch on your own script (or a config) and machine, and write the fastest settings.
Each setting runs as short isolated trials (fresh processes, warm-up excluded, interleaved
repeats, the baseline run again between candidates); a difference inside the measured
noise reads 'no measurable change'.
Examples:
  trainspeed tune -- python train.py --lr 3e-4          (your unchanged script)
  trainspeed tune --knobs num_workers,precision --budget 5m -- python train.py
  trainspeed tune --from runs/doctor-train-... -- python train.py   (the doctor's findings first)
  trainspeed tune gpt --budget 10m
  trainspeed tune my.yaml --knobs precision,compile,num_workers --out tune-out
  trainspeed tune gpt --variant naive data.batch_size=8
Outputs in --out: best.yaml (a script: `trainspeed run --with OUT/best.yaml -- python train.py ...`;
a config: `trainspeed train OUT/best.yaml`), tune.html, tune.json, tune.jsonl (rerun with the same
--out to resume), and for a script code_change.md + best.patch (`git apply OUT/best.patch`)."""


def _add_options(p: argparse.ArgumentParser) -> None:
    from trainspeed.tune.knobs import KNOBS

    p.add_argument("--from", dest="from_run", default=None, metavar="RUN_DIR",
                   help="a doctor run of the script: the knobs its findings name are measured first")
    p.add_argument("--budget", default="10m", type=duration,
                   help="wall-clock budget for all trials, with its unit: 90s, 10m, 1h (default 10m)")
    p.add_argument("--knobs", default=None, help=f"comma list (default: all). Config knobs: {','.join(KNOBS)}. "
                                                 "Script knobs: see `trainspeed tune --help-knobs`")
    p.add_argument("--help-knobs", action="store_true", help="list the knobs for a script and what each tries")
    p.add_argument("--out", default=None,
                   help="output directory (default: runs/tune-<script or recipe>, then -<knobs> when --knobs chose some)")
    p.add_argument("--variant", default="fast", choices=("naive", "fast"),
                   help="which config of a recipe to start from")
    p.add_argument("--repeats", type=int, default=2, help="interleaved repeats per setting")
    p.add_argument("--baseline-every", type=int, default=None,
                   help="in the ablation, run the baseline again after this many candidates, "
                        "so each is compared with the baseline trials next to it (default 2)")
    p.add_argument("--max-rounds", type=int, default=None,
                   help="rounds a setting gets at most, the budget's extra rounds for settings still "
                        "undecided included (default 12; 1: the --repeats rounds only)")
    p.add_argument("--verify-repeats", type=int, default=None,
                   help="interleaved rounds of the final check, baseline vs best (default 3)")
    p.add_argument("--warmup-steps", type=int, default=DEFAULT_WARMUP, help="untimed steps per trial")
    p.add_argument("--steps", type=int, default=None,
                   help="measured steps per trial (default 25; for a script, enough for ~4 s, at least 25)")
    p.add_argument("--loss-tolerance", type=float, default=0.05,
                   help="relative loss increase that flags a setting (default 0.05)")
    p.add_argument("--min-effect", type=float, default=0.03,
                   help="smallest relative change ever called a speedup (default 0.03)")
    p.add_argument("--trial-timeout", type=float, default=600.0, help="seconds before a trial is killed")
    p.add_argument("--print-config", action="store_true",
                   help="a config's tune: print the resolved config as YAML and exit")
    p.add_argument("--no-fork-server", dest="fork_server", action="store_false",
                   help="start every trial as a new interpreter instead of forking it from a "
                        "process that has imported torch once (slower start, same isolation)")


def register(sub) -> None:
    p = sub.add_parser("tune", help="measure each speed switch and write the fastest config",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", nargs="?", default=None,
                   help="a YAML config file or a recipe name; or, after `--`, the script's command")
    _add_options(p)
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="config overrides applied before tuning (key=value); options may follow them")
    p.set_defaults(run=run)


def is_script_command(target: str | None) -> bool:
    """`python ...`, `python3.11 ...`, `train.py ...`, `torchrun ...`: a command, not a config."""
    import os

    from trainspeed.doctor.command_words import is_interpreter

    if not target:
        return False
    name = os.path.basename(target)
    return is_interpreter(target) or name.endswith(".py") or name in ("torchrun", "accelerate")


def _print_knobs() -> int:
    from trainspeed.tune.script_knobs import SCRIPT_KNOBS

    import shutil
    import textwrap

    width = max(60, min(100, shutil.get_terminal_size().columns))
    print("Knobs for a script (trainspeed tune --knobs a,b -- python train.py ...):")
    for name, fn in SCRIPT_KNOBS.items():
        doc = " ".join((fn.__doc__ or "").split())  # the whole docstring: a first line cut sentences off
        print(textwrap.fill(doc, width=width, initial_indent=f"  {name:<20}", subsequent_indent=" " * 22,
                            break_on_hyphens=False, break_long_words=False))  # "per-step" stays one word
    return 0


def run_script(args, command: list[str]) -> int:
    import os
    import shlex
    from pathlib import Path

    from trainspeed.doctor.runner import parse_command
    from trainspeed.tune.progress import ProgressPrinter
    from trainspeed.tune.script_knobs import parse_script_knobs
    from trainspeed.tune.script_session import run_script_tune
    from trainspeed.tune.session import parse_budget
    from trainspeed.tune.table import print_tables

    from trainspeed.errors import ConfigError

    if (args.steps is not None and args.steps < 3) or args.warmup_steps < 0:
        raise ConfigError(f"--steps must be >= 3 and --warmup-steps >= 0, got {args.steps} and {args.warmup_steps}")
    from trainspeed.doctor.launch_forms import is_rank_launcher, parse_rank_launch

    if is_rank_launcher(command):  # the one-process command as the launcher's own parser reads it
        launch = parse_rank_launch(command)
        raise ConfigError(f"trainspeed tune: a {launch.kind} command starts several processes, and each trial "
                          "would need its own launcher; tune one process of it: trainspeed tune -- "
                          + shlex.join(launch.command))
    typed = list(command)  # what the user runs the winners with: `run --with` takes the launcher too
    if is_accelerate(command):
        command = one_process(command, "tune")  # the trials run it, with accelerate's environment
    target = parse_command(command)
    optional = {name: value for name, value in (("verify_repeats", args.verify_repeats),
                                                ("baseline_every", args.baseline_every),
                                                ("max_rounds", args.max_rounds)) if value is not None}
    options = TuneOptions(knobs=parse_script_knobs(args.knobs), budget_s=parse_budget(args.budget),
                          repeats=args.repeats, loss_tolerance=args.loss_tolerance,
                          min_effect=args.min_effect, fork_server=args.fork_server, **optional)
    stem = Path(target.name).stem if target.kind == "path" else target.name.rsplit(".", 1)[-1]
    out = Path(args.out or default_out(stem, args.knobs))
    say = ProgressPrinter()  # the lines fold at the terminal's width, or a log's (tune/progress.py)
    say(f"trainspeed: tuning `{shlex.join(typed)}` -> {out} (budget {options.budget_s:.0f} s, "
        f"knobs: {', '.join(options.knobs)})")
    with resume_hint(args, out):
        result = run_script_tune(command, out, options, warmup_steps=args.warmup_steps, measure_steps=args.steps,
                                 from_run=args.from_run, trial_timeout_s=args.trial_timeout)
    print_tables(result)
    print(f"table: {out / 'tune.html'}")
    for line in outcome_lines(result, out, typed):
        # a command to copy stays one line (a command folded in two does not paste); prose folds
        (print if line.startswith(COMMAND_LINES) else say)(line)
    return unmeasured_exit(result)


COMMAND_LINES = ("run it now:", "then run:")
"""Closing lines that hold a command to copy: printed whole at any width."""


def default_out(stem: str, knobs: str | None) -> str:
    """runs/tune-<script or recipe>, and -<knobs> after it when --knobs chose some: the doctor's
    findings print one `--knobs` tune each, and run one after another into one folder, the
    second (precision, compile: nothing won) replaced the first's best.yaml and removed its
    best.patch (nanoGPT's threads=1), and reused its trials, measured at another length."""
    chosen = [k.strip() for k in (knobs or "").split(",") if k.strip()]
    suffix = "-" + "-".join(chosen) if chosen else ""
    return f"runs/tune-{stem}{suffix}"


def unmeasured_exit(result) -> int:
    """0 when a setting was measured; else NOTHING_MEASURED, with why on stderr (a script or CI
    reading the status must not take 'nothing measured' for 'nothing wins')."""
    import sys

    if not any(row.speedup is not None for row in result.ablation) and result.ablation:
        from trainspeed.tune.progress import ProgressPrinter

        ProgressPrinter(sys.stderr)(f"trainspeed tune: {no_winner_line(result)}")  # folded as stdout's lines
        return NOTHING_MEASURED
    return 0


def resume_command(argv: list[str], out) -> str:
    """The command that resumes a tune: the one typed, with --out named (a tune rerun with the
    same --out reuses its finished trials)."""
    import shlex

    words = list(argv)
    end = words.index("--") if "--" in words else len(words)
    if not any(w == "--out" or w.startswith("--out=") for w in words[:end]):
        words[1:1] = ["--out", str(out)]  # after "tune"
    from trainspeed.doctor.instrument.import_path import with_own_env

    # the trials ran with this process's PYTHONPATH and variables (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1): so does its resume
    return with_own_env("trainspeed " + shlex.join(words))


@contextlib.contextmanager
def resume_hint(args, out):
    """On Ctrl-C, SIGTERM (`timeout 10m trainspeed tune ...`, a scheduler) or SIGHUP (the
    terminal or SSH session closed), the command that resumes the tune (then the interrupt goes
    on to main); on a full disk under --out, the same command, to run once space is freed.
    SIGTERM, SIGHUP and SLURM's SIGUSR1 ended the tune silently: the finished trials were kept, and nothing said
    so or how to go on; a full disk said only 'cannot write: No space left on device'."""
    import signal
    import sys

    from trainspeed.errors import NO_SPACE_ERRNOS
    from trainspeed.stop_signals import raise_on_stop_signals

    def terminated(signum: int) -> KeyboardInterrupt:
        stop = KeyboardInterrupt(signal.Signals(signum).name)
        stop.exit_code = 128 + signum  # type: ignore[attr-defined]  # 143, 129: the shell's code for it
        return stop

    restore = raise_on_stop_signals(terminated, also=("SIGUSR1",))

    def say(first: str) -> None:
        argv = getattr(args, "argv", None) or ["tune", "--", *([args.target] if args.target else []), *args.rest]
        from trainspeed.tune.progress import ProgressPrinter

        try:  # after SIGHUP the terminal may be gone: the trials are kept either way
            # folded as stdout's lines, the command whole on a line of its own (it is copied)
            store = out / "tune.jsonl"
            kept = f"the finished trials are kept in {store}" if store.exists() else "no trial had finished"
            ProgressPrinter(sys.stderr)(f"\ntrainspeed tune: {first}; {kept}. Resume with:")
            print(f"    {resume_command(argv, out)}", file=sys.stderr, flush=True)
        except OSError:
            pass

    try:
        yield
    except KeyboardInterrupt:
        say("interrupted")
        raise
    except OSError as exc:
        if exc.errno in NO_SPACE_ERRNOS:
            where = exc.filename or out
            say(f"no space left on {where} (free space on that disk first)")
        raise
    finally:
        restore()


def outcome_lines(result, out, command: list[str]) -> list[str]:
    """What the user does next: run the winners, apply the patch; or, when nothing won, that
    there is no patch (a best.patch left by an earlier tune in the same --out is gone by now: the
    outputs land as one set, which removes the files this tune did not write: session.output_set)."""
    import json
    import shlex

    # the script ran with this process's PYTHONPATH (`PYTHONPATH=. trainspeed tune ...`) and variables
    # (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1): so do these commands, or they may crash where the trials did not
    from trainspeed.doctor.instrument.import_path import with_own_env

    patch, change = out / "best.patch", out / "code_change.md"
    try:
        record = json.loads((out / "tune.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    # the patch this tune wrote (tune.json says), not one an earlier tune left where it could not be removed
    written = bool(record.get("patch")) and patch.is_file()
    if not result.best_settings:
        return [no_winner_line(result),
                f"no patch: nothing won, so there is no {patch} to apply and the script stays as it is"]
    from trainspeed.tune.script_knobs import is_whatif

    if written and all(is_whatif({key: value}) for key, value in result.best_settings.items()):
        # only what-ifs won: they are edits of the code, so best.yaml holds no setting and
        # `run --with best.yaml` would run the script as it is (script_session.write_script_outputs)
        tuned = record.get("tuned_command") or command
        return [f"apply it:     git apply {patch}  (the winners are edits of your code: {change})",
                f"then run:     {with_own_env(shlex.join(tuned))}"]
    run = f"trainspeed run --with {out / 'best.yaml'} -- {shlex.join(command)}"
    lines = [f"run it now:   {with_own_env(run)}"]
    if written:
        lines.append(f"code change:  {change}  (apply: git apply {patch})")
    elif change.is_file():
        import importlib.util

        why = ("no patch: LibCST is not installed; pip install 'trainspeed[patch]', then run this tune "
               "again with the same --out (its trials are reused)" if importlib.util.find_spec("libcst") is None
               else "no patch: the change is described there")
        lines.append(f"code change:  {change}  ({why})")
    return lines


def _speedups(rows) -> str:
    """`knob=setting (1.19x), ...` of the rows that were measured."""
    return ", ".join(f"{row.knob}={row.setting} ({row.speedup:.2f}x)" for row in rows if row.speedup)


UNDECIDED = 1.0 + MIN_EFFECT
"""A setting reading at least this fast (the default --min-effect floor), its interval reaching
as far, with no measurable change is undecided, not "already the fastest": the closing line
says so."""


def no_winner_line(result) -> str:
    """Why best.yaml keeps the script as it is: measured settings lost, or none could be measured
    (a crash, a far-slower stop, the budget): the latter is no verdict on the script."""
    measured = [row for row in result.ablation if row.speedup is not None]
    won = [row for row in result.ablation if row.verdict == "faster" and row.speedup is not None]
    wins = _speedups(won)
    from trainspeed.tune.stats import BUSY, LOSS_MISMATCH, NO_CHANGE, SKIPPED, SLOWER

    final = getattr(result, "final", None)
    busy = [row for row in [*result.ablation, final] if row is not None and row.verdict == BUSY]
    if busy:  # load_proof.py: a winner on mismatched load is no winner, nor proof of none
        return (f"nothing is kept: {_speedups(busy)} read faster, but other processes' load differed between its "
                "trials and the baseline's: not measurable while the machine is busy. Rerun when it is quiet, or give "
                "the tune cores of its own (taskset -c)")
    from trainspeed.patches.whatif_code import CODE_PREFIX
    from trainspeed.tune.verify import VERIFY_OFF

    if won and final is not None and final.verdict not in ("faster", "skipped") \
            and any(str(k).startswith(CODE_PREFIX) for k in final.settings):
        # a what-if won; the verification ran best.patch's edit of the code (edited_source.py)
        from trainspeed.tune.table import why_no_change

        if final.verdict == "failed":  # script_session.say_patched_code wrote why
            return f"nothing is kept: {wins} won, but {final.note or 'its verification failed'}"
        why = why_no_change(final) or ((final.note or "").splitlines() or [final.verdict])[0]
        return (f"nothing is kept: {wins} won, but best.patch's edit of your code, run in the verification, "
                f"read '{final.verdict}' ({why}): no patch on that evidence")
    if won and (final is None or final.verdict == "skipped"):
        # run_clm.py's 6m tune: bf16 1.15x alone, then the budget ran out before the verification,
        # and the line said the script was "already the fastest measured here".
        why = (final.note if final is not None and final.note else "it was not run")
        if why == VERIFY_OFF:
            return (f"nothing is kept: {wins} won alone, but {why}; rerun with the same --out and "
                    "--verify-repeats 3 to verify it from these trials")
        return (f"nothing is kept: {wins} won alone, but the verification against the baseline was skipped "
                f"({why}); rerun with the same --out and a larger --budget to verify it from these trials")
    if won and final is not None and final.speedup is not None and final.verdict in (NO_CHANGE, SLOWER):
        return _unverified_line(wins, final)
    hopeful = sorted((row for row in measured if row.faster_inside_noise), key=lambda row: -row.speedup)
    if hopeful:
        # dcgan on a noisy VM: channels_last 1.16x (CI 1.14-1.19) and fused 1.12x in the table, and
        # this line said the script was "already the fastest measured here"
        reads = ", ".join(f"{row.knob}={row.setting} {row.speedup:.2f}x" for row in hopeful[:3])
        noise = max((row.noise for row in hopeful if row.noise is not None), default=None)
        beyond = f" (±{noise:.0%})" if noise else ""
        return (f"nothing is kept: {reads} read faster, but not beyond this machine's run-to-run noise{beyond}; "
                "rerun on a quieter machine, or with the same --out and a larger --budget for more rounds")
    undecided = sorted((row for row in measured if row.verdict == NO_CHANGE and row.speedup >= UNDECIDED
                        and row.ci is not None and row.ci[1] >= UNDECIDED), key=lambda row: -row.speedup)
    if undecided:
        # nanoGPT's 20-minute compile tune on a busier machine: 1.08x over four rounds (CI
        # 1.00-1.15) in a ±10 % band, and this line said the script's settings were "already the
        # fastest measured here"
        row = undecided[0]
        band = f" (±{row.noise:.0%})" if row.noise else ""
        return (f"nothing is kept, nor known to lose: {row.knob}={row.setting} read {row.speedup:.2f}x "
                f"(CI {row.ci[0]:.2f}–{row.ci[1]:.2f}), undecided within this machine's run-to-run noise{band}; "
                "rerun on a quieter machine, or with the same --out and a larger --budget for more rounds")
    mismatched = sorted((row for row in measured if row.verdict == LOSS_MISMATCH and row.speedup >= UNDECIDED
                         and row.loss_delta is not None and math.isfinite(row.loss_delta)), key=lambda row: -row.speedup)
    if mismatched:
        # dcgan --manualSeed 1: bf16 read 1.10x and was refused for its generator's loss (+8 %),
        # and this line said the script's settings were "already the fastest measured here". A
        # non-finite loss is never offered a larger tolerance.
        row = mismatched[0]
        wider = math.ceil(abs(row.loss_delta) * 20 + 1e-9) / 20  # the next 5 % step past the difference
        return (f"nothing is kept: {row.knob}={row.setting} read {row.speedup:.2f}x faster, but its loss was "
                f"{row.loss_delta:+.1%} off the baseline's, beyond the tolerance (its note says whose and why). Where "
                f"that difference is acceptable for your model, rerun with the same --out and --loss-tolerance {wider:g}")
    if measured:
        # reinforce.py's 3m tune measured 2 of its 9 settings (the rest did not fit the budget or
        # were stopped before a baseline's time) and this line said the script's settings were
        # "already the fastest measured here", as if the other 7 had lost
        gaps = [row for row in result.ablation if row.speedup is None and row.verdict == SKIPPED
                and "budget" in str(row.note or "")]
        if not gaps:
            return "nothing won over the baseline: your script's settings are already the fastest measured here"
        return (f"nothing won over the baseline among the {len(measured)} setting(s) measured; not measured: "
                f"{_unmeasured(gaps)}. Rerun with the same --out and a larger --budget to measure them from "
                "these trials")
    return f"no setting could be measured, so nothing is known to win ({_unmeasured(result.ablation) or 'no knob applied'})"


def _unmeasured(rows) -> str:
    """The rows' settings grouped by why each was not measured. One line per reason, its settings
    together: 15 settings skipped for the budget read as a wall of the same sentence (chargpt's
    4m tune), the actionable part lost in it. Budget notes differ only in their figures: grouped
    by the sentence, the first one's figures shown (the first setting to fit names the smallest
    budget that measures something)."""
    reasons: dict[str, tuple[str, list[str]]] = {}
    for row in rows:
        why = str(row.note or row.verdict)
        key = why.split(" (~")[0] if why.startswith("does not fit the budget") else why
        reasons.setdefault(key, (why, []))[1].append(f"{row.knob}={row.setting}")
    return "; ".join(f"{', '.join(settings)}: {why}" for why, settings in reasons.values())


def _unverified_line(wins: str, final) -> str:
    """The ablation's winner whose verification against the baseline did not read faster beyond
    the noise. word_language_model's 3m tune: fused AdamW 1.17x alone (CI 1.07-1.26), then the
    verification read 1.08x (CI 1.00-1.15) in a ±14 % band, and the closing line said the
    script's settings were "already the fastest measured here"."""
    read = f"read {final.speedup:.2f}x"
    if final.ci is not None:
        read += f" (CI {final.ci[0]:.2f}–{final.ci[1]:.2f})"
    band = f" (±{final.noise:.0%})" if final.noise is not None else ""
    more = "rerun on a quieter machine, or with the same --out and a larger --budget for more verification rounds"
    if final.faster_inside_noise:
        # nanoGPT: fused 1.19x alone (CI 1.17-1.21), then the verification read 1.09x (CI 1.08-1.10)
        return f"nothing is kept: {wins} won alone, and verified against the baseline {read}, faster but not " \
               f"beyond this machine's run-to-run noise{band}; {more}"
    if final.speedup >= UNDECIDED and final.ci is not None and final.ci[1] >= UNDECIDED:
        return f"nothing is kept, nor known to lose: {wins} won alone, but verified against the baseline it " \
               f"{read}, undecided within this machine's run-to-run noise{band}; {more}"
    return f"nothing is kept: {wins} won alone, but verified against the baseline it {read}: the gain did not hold"


def run(args) -> int:
    from pathlib import Path

    from trainspeed.cli import _target
    from trainspeed.config import recipe_label
    from trainspeed.errors import ConfigError
    from trainspeed.tune.knobs import parse_knobs
    from trainspeed.tune.search import TuneOptions
    from trainspeed.tune.session import TrialLength, parse_budget, run_tune
    from trainspeed.tune.table import print_tables

    if args.help_knobs:
        return _print_knobs()
    if is_script_command(args.target):
        return run_script(args, [args.target, *args.rest])
    if args.target is None:
        raise ConfigError("trainspeed tune: give a script's command after `--` (trainspeed tune -- python "
                          "train.py ARGS), a recipe name or a config file")
    if args.from_run:
        raise ConfigError("--from RUN_DIR tunes a script: trainspeed tune --from RUN_DIR -- python train.py ARGS")
    args.steps = 25 if args.steps is None else args.steps
    if args.steps < 3 or args.warmup_steps < 0:
        raise ConfigError(f"--steps must be >= 3 and --warmup-steps >= 0, got {args.steps} and {args.warmup_steps}")
    # Options may come after the overrides (`tune gpt data.batch_size=8 --budget 5m`).
    asked_help, overrides = _target.parse_rest(args, _add_options, "trainspeed tune")
    if asked_help:
        print(_target.target_help("tune", args.target, overrides, args.variant), end="")
        print("\nTune options (--budget, --knobs, --out, ...): trainspeed tune --help")
        return 0
    cfg, found = _target.load(args.target, overrides, args.variant)
    if args.print_config:
        print(_target.config_yaml(cfg, keep_name=_target.named(found, overrides)), end="")
        return 0
    _target.check_extras(cfg)  # before any trial: each would fail on it
    # Options left out keep TuneOptions' defaults (documented there, not repeated here).
    optional = {name: value for name, value in (("verify_repeats", args.verify_repeats),
                                                ("baseline_every", args.baseline_every),
                                                ("max_rounds", args.max_rounds)) if value is not None}
    options = TuneOptions(knobs=parse_knobs(args.knobs), budget_s=parse_budget(args.budget),
                          repeats=args.repeats, loss_tolerance=args.loss_tolerance,
                          min_effect=args.min_effect, fork_server=args.fork_server, **optional)
    out = Path(args.out or default_out(recipe_label(cfg.recipe.name) if cfg.recipe.name else Path(args.target).stem,
                                       args.knobs))
    from trainspeed.tune.progress import ProgressPrinter

    ProgressPrinter()(f"trainspeed: tuning {cfg.recipe.name or args.target} -> {out} "
                      f"(budget {options.budget_s:.0f} s, knobs: {', '.join(options.knobs)})")
    with resume_hint(args, out):
        result = run_tune(cfg, out, options, trial_timeout_s=args.trial_timeout,
                          length=TrialLength(warmup_steps=args.warmup_steps, measure_steps=args.steps))
    print_tables(result)
    print(f"best config: {out / 'best.yaml'}   table: {out / 'tune.html'}")
    return unmeasured_exit(result)
