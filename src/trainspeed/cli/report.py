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
    parser.add_argument("--rediagnose", action="store_true",
                        help="recompute the findings with this version's rules and store them in report.json "
                             "(by default a run's stored findings are shown; a run without them is diagnosed)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from trainspeed.report.compare import comparability
    from trainspeed.report.load import load_run
    from trainspeed.report.render import render_compare, render_run, report_json
    from trainspeed.rich_console import new_console

    html: bool | str = False if args.no_html else (args.html or True)
    for run_dir in filter(None, (args.run_dir, args.compare)):
        _ensure_findings(run_dir, force=args.rediagnose)
    if args.json:
        # stdout carries only the JSON document; the HTML path note goes to stderr.
        a = load_run(args.run_dir)
        b = load_run(args.compare) if args.compare else None
        doc = report_json(a, b)
        if b is not None:
            doc["comparability"] = comparability(a.run, b.run).as_dict()
        print(json.dumps(doc, indent=2, default=str))
        if html is not False:
            err = new_console(stderr=True)
            if b is None:
                render_run(args.run_dir, html=html, console=err, terminal=False)
            else:
                render_compare(args.run_dir, args.compare, html=html, console=err, terminal=False)
        return 0
    console = new_console()  # the terminal's width, or a log's (rich_console.py)
    if args.compare:
        render_compare(args.run_dir, args.compare, html=html, console=console, comparability=True)
    else:
        render_run(args.run_dir, html=html, console=console)
    sys.stdout.flush()
    return 0


def _ensure_findings(run_dir: str, *, force: bool) -> None:
    """Findings are a function of the run directory: a run whose report.json has none (a
    Monitor or Trainer run from before findings were stored at every run's end, a crashed run)
    is diagnosed now, and report.json updated, so the terminal, HTML and --json all show them."""
    import sys

    from trainspeed.doctor.findings import format_findings
    from trainspeed.telemetry.diagnosis import ensure_findings

    findings, stored = ensure_findings(run_dir, force=force)
    if not stored:  # a read-only copy of a run: say them here, the report below cannot
        print(f"trainspeed: {run_dir}/report.json is not writable; its findings, computed now:\n"
              f"{format_findings(findings)}", file=sys.stderr)
