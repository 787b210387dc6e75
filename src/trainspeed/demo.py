"""`make demo`: the story a new user should see first, on any machine, with no download.

1. the gpt recipe's naive config (fp32, workers 0, log every step), diagnosed by the doctor;
2. the fast config, trained by the engine;
3. the compare report of the two: terminal summary plus the path of the HTML file.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def _cli(argv: list[str]) -> int:
    from trainspeed.cli.main import main

    print(f"\n$ trainspeed {' '.join(argv)}", flush=True)
    return main(argv)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainspeed.demo")
    ap.add_argument("--steps", type=int, default=100)  # ~1.5 minutes on a 2-core CPU
    ap.add_argument("--out", default="runs/demo")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    naive, fast = out / "gpt-naive", out / "gpt-fast"
    common = [f"run.max_steps={args.steps}", f"run.out_dir={out}"]

    rc = _cli(["doctor", "--steps", str(args.steps), "--out", str(naive), "--",
               "python", "-m", "trainspeed", "train", "gpt", "--naive", "--no-report",
               *common, "run.name=gpt-naive-engine", "logging.progress=false"])
    if rc != 0:
        return rc
    rc = _cli(["train", "gpt", *common, "run.name=gpt-fast"])
    if rc != 0:
        return rc
    return _cli(["report", str(naive), "--compare", str(fast)])


if __name__ == "__main__":
    sys.exit(main())
