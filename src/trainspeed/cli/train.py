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

OWN_FLAGS = {"--naive", "--auto-resume", "--no-report", "--help", "-h", "--print-config"}
OWN_VALUED = {"--resume", "--name", "--variant"}


def register(sub) -> None:
    p = sub.add_parser("train", help="train a recipe or config", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="a YAML config file, a recipe name (see `trainspeed recipes`) or "
                                  "your model's import path (mymodel:build)")
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="overrides (key=value) and --naive, --variant V, --resume PATH, "
                        "--auto-resume, --name NAME, --no-report, --print-config, --help")
    p.set_defaults(run=run)


def split_own_flags(rest: list[str]) -> tuple[dict[str, object], list[str]]:
    """Pick our flags out of the override list (overrides may also start with --)."""
    own: dict[str, object] = {}
    overrides: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        key = arg.split("=", 1)[0]
        if arg in OWN_FLAGS:
            own[arg] = True
        elif key in OWN_VALUED:
            if "=" in arg:
                own[key] = arg.split("=", 1)[1]
            else:
                i += 1
                own[key] = rest[i] if i < len(rest) else None
        else:
            overrides.append(arg)
        i += 1
    return own, overrides


def run(args) -> int:
    from trainspeed.cli import _target

    own, overrides = split_own_flags(list(args.rest))
    variant = "naive" if own.get("--naive") else str(own.get("--variant") or "fast")
    if own.get("--resume"):
        overrides.append(f"checkpoint.resume={own['--resume']}")
    if own.get("--auto-resume"):
        overrides.append("checkpoint.auto_resume=true")
    if own.get("--name"):
        overrides.append(f"run.name={own['--name']}")
    if own.get("--help") or own.get("-h"):
        print(_target.target_help("train", args.target, overrides, variant), end="")
        return 0
    cfg, found = _target.load(args.target, overrides, variant)
    if own.get("--print-config"):
        print(_target.config_yaml(cfg, keep_name=_target.named(found, overrides)), end="")
        return 0
    _target.check_extras(cfg)  # before the model and data are built

    from trainspeed.engine.from_recipe import build_trainer

    trainer = build_trainer(cfg)
    lead = trainer.rank == 0  # data parallel: rank 0 speaks and writes the report
    if lead:
        print(f"trainspeed: training {cfg.recipe.name or args.target} -> {trainer.run_dir}")
    trainer.fit()
    if lead and not own.get("--no-report"):
        from trainspeed.cli._finish import finish_run

        finish_run(trainer.run_dir, kind="train")
    return 0
