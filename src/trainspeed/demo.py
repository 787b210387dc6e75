"""`make demo`: the story a new user should see first, on any machine, with no download.

1. the gpt recipe's naive config (fp32, workers 0, log every step), diagnosed by the doctor;
2. the fast config, trained by the engine;
3. the compare report of the two: terminal summary plus the path of the HTML file.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path


def _cli(argv: list[str]) -> int:
    from trainspeed.cli.main import main

    print(f"\n$ trainspeed {' '.join(argv)}", flush=True)
    return main(argv)


def _throughput(run_dir: Path) -> float | None:
    try:
        return json.loads((run_dir / "report.json").read_text())["summary"]["tokens_per_s"]
    except (OSError, KeyError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainspeed.demo")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="runs/demo")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    naive, fast = out / "gpt-naive", out / "gpt-fast"
    common = [f"run.max_steps={args.steps}", f"run.out_dir={out}"]

    try:
        import trainspeed.cli.doctor  # noqa: F401

        rc = _cli(["doctor", "--steps", str(args.steps), "--out", str(naive), "--",
                   "python", "-m", "trainspeed", "train", "gpt", "--naive", "--no-report",
                   *common, "run.name=gpt-naive-engine", "logging.progress=false"])
    except ImportError:
        rc = _cli(["train", "gpt", "--naive", *common, "run.name=gpt-naive"])
    if rc != 0:
        return rc
    rc = _cli(["train", "gpt", *common, "run.name=gpt-fast"])
    if rc != 0:
        return rc
    try:
        import trainspeed.cli.report  # noqa: F401

        rc = _cli(["report", str(naive), "--compare", str(fast)])
    except ImportError:
        a, b = _throughput(naive), _throughput(fast)
        if a and b:
            print(f"\nnaive {a:,.0f} tokens/s -> fast {b:,.0f} tokens/s: {b / a:.2f}x")
    return rc


if __name__ == "__main__":
    sys.exit(main())
