"""`trainspeed train CONFIG.yaml|RECIPE [--naive] [overrides ...]`"""

from __future__ import annotations

import argparse

HELP = """Train a recipe or a config. Overrides: data.num_workers=4 or --data.num_workers 4.
Examples:
  trainspeed train gpt                      the gpt recipe's fast config
  trainspeed train gpt --naive run.max_steps=100
  trainspeed train my.yaml precision.mode=bf16-mixed --auto-resume
  trainspeed train mymodel:build            your own model (docs/own-model.md)
  trainspeed train gpt --help               every key of that target, its value and meaning
  trainspeed train gpt --print-config > my.yaml    the resolved config as YAML"""


def _add_options(p: argparse.ArgumentParser) -> None:
    """The options of `train`, before or after the target (the rest are overrides)."""
    p.add_argument("--naive", action="store_true", help="start from the recipe's naive config (= --variant naive)")
    p.add_argument("--variant", default=None, choices=("naive", "fast"),
                   help="which config of a recipe to start from (default fast)")
    p.add_argument("--resume", default=None, metavar="PATH", help="resume from this checkpoint (checkpoint.resume)")
    p.add_argument("--auto-resume", action="store_true",
                   help="resume from the newest checkpoint of the run directory, if there is one")
    p.add_argument("--name", default=None, help="run name (run.name; default <recipe>-<time>)")
    p.add_argument("--no-report", action="store_true", help="write no report.html and print no report at the end")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")


def register(sub) -> None:
    p = sub.add_parser("train", help="train a recipe or config", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="a YAML config file, a recipe name (see `trainspeed recipes`) or "
                                  "your model's import path (mymodel:build)")
    _add_options(p)
    rest = p.add_argument("rest", nargs=argparse.REMAINDER, metavar="OVERRIDES",
                          help="key=value or --key value, e.g. data.num_workers=4 (options may follow them)")
    rest.required = False  # `trainspeed train` names the target as what is missing, not this
    p.set_defaults(run=run)


def run(args) -> int:
    from trainspeed.cli import _target

    asked_help, overrides = _target.parse_rest(args, _add_options, "trainspeed train")
    variant = "naive" if args.naive else (args.variant or "fast")
    if args.resume:
        overrides.append(f"checkpoint.resume={args.resume}")
    if args.auto_resume:
        overrides.append("checkpoint.auto_resume=true")
    if args.name:
        overrides.append(f"run.name={args.name}")
    if asked_help:
        print(_target.target_help("train", args.target, overrides, variant), end="")
        return 0
    from trainspeed.startup import preload

    # what loading, building and training import: ~1 s less CPU in a process of its own (startup.py)
    preload(freeze=getattr(args, "own_process", False))
    cfg, found = _target.load(args.target, overrides, variant)
    if args.print_config:
        print(_target.config_yaml(cfg, keep_name=_target.named(found, overrides)), end="")
        return 0
    _target.check_extras(cfg)  # before the model and data are built
    if args.no_report:
        import os

        # W&B prints its run history and summary at finish(): a report by another name. Its
        # quiet mode keeps the lines that say where the run went. An explicit setting wins.
        os.environ.setdefault("WANDB_QUIET", "true")

    from trainspeed.engine.from_recipe import build_trainer

    trainer = build_trainer(cfg)
    lead = trainer.rank == 0  # data parallel: rank 0 speaks and writes the report
    if lead:
        print(f"trainspeed: training {cfg.recipe.name or args.target} -> {trainer.run_dir}")
    trainer.fit()
    if lead and not args.no_report:
        from trainspeed.cli._finish import finish_run

        finish_run(trainer.run_dir, kind="train")
    return 0
