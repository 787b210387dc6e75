"""`trainspeed recipes`: list the built-in workloads and their naive/fast configs."""

from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "recipes",
        help="list built-in recipes and their naive/fast config files",
        description="List built-in recipes with their naive ('before') and fast config files. "
        "Train one with: trainspeed train <config path>",
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
    return 0
