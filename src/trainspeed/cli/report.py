"""`trainspeed report RUN_DIR [--compare OTHER] [--html PATH] [--no-html] [--json]`."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report",
        help="show a run directory's report (terminal + self-contained HTML), or compare two runs",
        description="Render a run directory: summary, phase breakdown, ranked findings, plots. "
                    "With --compare, show two runs side by side with B/A ratios.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory (contains steps.jsonl)")
    parser.add_argument("--compare", metavar="OTHER_RUN_DIR", help="second run (B) to compare against RUN_DIR (A)")
    parser.add_argument("--html", metavar="PATH",
                        help="where to write the HTML report (default: RUN_DIR/report.html; "
                             "with --compare: OTHER_RUN_DIR/compare.html)")
    parser.add_argument("--no-html", action="store_true", help="terminal only; write no HTML")
    parser.add_argument("--json", action="store_true",
                        help="print summary, findings and skipped-line notes as JSON instead of tables")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from rich.console import Console

    from trainspeed.report.load import load_run
    from trainspeed.report.render import render_compare, render_run, report_json

    html: bool | str = False if args.no_html else (args.html or True)
    if args.json:
        # stdout carries only the JSON document; the HTML path note goes to stderr.
        a = load_run(args.run_dir)
        b = load_run(args.compare) if args.compare else None
        print(json.dumps(report_json(a, b), indent=2, default=str))
        if html is not False:
            err = Console(stderr=True)
            if b is None:
                render_run(args.run_dir, html=html, console=err, terminal=False)
            else:
                render_compare(args.run_dir, args.compare, html=html, console=err, terminal=False)
        return 0
    console = Console()
    if args.compare:
        render_compare(args.run_dir, args.compare, html=html, console=console)
    else:
        render_run(args.run_dir, html=html, console=console)
    sys.stdout.flush()
    return 0
