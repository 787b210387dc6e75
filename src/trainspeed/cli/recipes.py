"""`trainspeed recipes`: list the built-in workloads and their naive/fast configs."""

from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "recipes",
        help="list built-in recipes and their naive/fast config files",
        description="List built-in recipes with their naive ('before') and fast config files. "
        "Train one with: trainspeed train <config path>; its keys: trainspeed train RECIPE --help. "
        "Your own model: recipe: {name: mymodel:build} in a YAML (docs/own-model.md)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of text")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trainspeed.recipes.base import VARIANTS
    from trainspeed.recipes.registry import list_recipes

    rows = [
        {
            "name": r.name,
            "description": r.description,
            **{variant: str(r.config_path(variant)) for variant in VARIANTS},
        }
        for r in list_recipes()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no recipes available")
        return 0
    for row in rows:
        print(f"{row['name']}: {row['description']}")
        for variant in VARIANTS:
            print(f"  {variant:<6} {row[variant]}")
    print("\nEvery key of one, with its value and meaning: trainspeed train RECIPE --help")
    print("Your own model: a YAML with recipe: {name: mymodel:build} (docs/own-model.md)")
    return 0
