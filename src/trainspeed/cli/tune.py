"""`trainspeed tune CONFIG.yaml|RECIPE [--budget 10m] [--knobs a,b] [--out DIR] [overrides]`"""

from __future__ import annotations

import argparse

HELP = """Measure every speed switch on your model and machine, and write the fastest config.
Each setting runs as short isolated trials (fresh processes, warm-up excluded, interleaved
repeats, the baseline run again between candidates); a difference inside the measured
noise reads 'no measurable change'.
Examples:
  trainspeed tune gpt --budget 10m
  trainspeed tune my.yaml --knobs precision,compile,num_workers --out tune-out
  trainspeed tune gpt --variant naive data.batch_size=8
Outputs in --out: best.yaml (train it with `trainspeed train OUT/best.yaml`), tune.html,
tune.json, and tune.jsonl (rerun with the same --out to resume)."""


def _add_options(p: argparse.ArgumentParser) -> None:
    from trainspeed.tune.knobs import KNOBS

    p.add_argument("--budget", default="10m", help="wall-clock budget for all trials (90s, 10m, 1h)")
    p.add_argument("--knobs", default=None, help=f"comma list (default: all): {','.join(KNOBS)}")
    p.add_argument("--out", default=None, help="output directory (default: runs/tune-<recipe>)")
    p.add_argument("--variant", default="fast", choices=("naive", "fast"),
                   help="which config of a recipe to start from")
    p.add_argument("--repeats", type=int, default=2, help="interleaved repeats per setting")
    p.add_argument("--baseline-every", type=int, default=None,
                   help="in the ablation, run the baseline again after this many candidates, "
                        "so each is compared with the baseline trials next to it (default 2)")
    p.add_argument("--verify-repeats", type=int, default=None,
                   help="interleaved rounds of the final check, baseline vs best (default 3)")
    p.add_argument("--warmup-steps", type=int, default=5, help="untimed steps per trial")
    p.add_argument("--steps", type=int, default=25, help="measured steps per trial")
    p.add_argument("--loss-tolerance", type=float, default=0.05,
                   help="relative loss increase that flags a setting (default 0.05)")
    p.add_argument("--min-effect", type=float, default=0.03,
                   help="smallest relative change ever called a speedup (default 0.03)")
    p.add_argument("--trial-timeout", type=float, default=600.0, help="seconds before a trial is killed")
    p.add_argument("--no-fork-server", dest="fork_server", action="store_false",
                   help="start every trial as a new interpreter instead of forking it from a "
                        "process that has imported torch once (slower start, same isolation)")


def register(sub) -> None:
    p = sub.add_parser("tune", help="measure each speed switch and write the fastest config",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="a YAML config file or a recipe name")
    _add_options(p)
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="config overrides applied before tuning (key=value); options may follow them")
    p.set_defaults(run=run)


def _split_rest(args) -> list[str]:
    """Options may come after the overrides (`tune gpt data.batch_size=8 --budget 5m`):
    parse them out of the remainder; what is left are the overrides."""
    p = argparse.ArgumentParser(add_help=False)
    _add_options(p)
    known, overrides = p.parse_known_args(args.rest, namespace=args)
    return overrides


def run(args) -> int:
    from pathlib import Path

    from trainspeed.engine.from_recipe import load_target
    from trainspeed.errors import ConfigError
    from trainspeed.tune.knobs import parse_knobs
    from trainspeed.tune.search import TuneOptions
    from trainspeed.tune.session import TrialLength, parse_budget, run_tune
    from trainspeed.tune.table import print_tables

    if args.steps < 3 or args.warmup_steps < 0:
        raise ConfigError(f"--steps must be >= 3 and --warmup-steps >= 0, got {args.steps} and {args.warmup_steps}")
    overrides = _split_rest(args)
    cfg = load_target(args.target, overrides, args.variant)
    # Options left out keep TuneOptions' defaults (documented there, not repeated here).
    optional = {name: value for name, value in (("verify_repeats", args.verify_repeats),
                                                ("baseline_every", args.baseline_every)) if value is not None}
    options = TuneOptions(knobs=parse_knobs(args.knobs), budget_s=parse_budget(args.budget),
                          repeats=args.repeats, loss_tolerance=args.loss_tolerance,
                          min_effect=args.min_effect, fork_server=args.fork_server, **optional)
    out = Path(args.out or f"runs/tune-{cfg.recipe.name or Path(args.target).stem}")
    print(f"trainspeed: tuning {cfg.recipe.name or args.target} -> {out} "
          f"(budget {options.budget_s:.0f} s, knobs: {', '.join(options.knobs)})")
    result = run_tune(cfg, out, options, trial_timeout_s=args.trial_timeout,
                      length=TrialLength(warmup_steps=args.warmup_steps, measure_steps=args.steps))
    print_tables(result)
    print(f"best config: {out / 'best.yaml'}   table: {out / 'tune.html'}")
    return 0
