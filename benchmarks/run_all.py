"""`make bench`: run every benchmark (each in a fresh process), then regenerate the README's
performance table from benchmarks/results/*.json.

    python benchmarks/run_all.py [--only NAME ...] [--table-only]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
README = HERE.parent / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
# Order = the README table's order. Each entry: script, extra args for `make bench`.
BENCHMARKS: list[tuple[str, list[str]]] = [
    ("monitor_overhead.py", []),
    ("long_run.py", []),
    ("engine_overhead.py", []),
    ("phase_forms.py", []),
    ("doctor_overhead.py", []),
    ("checkpoint.py", []),
    ("recipes.py", []),
    ("tune.py", []),
    ("trial_start.py", []),
]

# Run only where CUDA is present (`make bench` on a lent GPU machine).
GPU_BENCHMARKS: list[tuple[str, list[str]]] = [
    ("gpu_mfu.py", []),
]


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def table() -> str:
    # The date column: rows of machines not lent again keep their last figures, measured with
    # the code of that day.
    rows = ["| benchmark | machine | measured | result | goal | met | command |", "|---|---|---|---|---|---|---|"]
    for path in sorted((HERE / "results").glob("*.json")):
        data = json.loads(path.read_text())
        head = data.get("headline") or {}
        if not head:
            continue
        met = {True: "yes", False: "**no**"}.get(head.get("passed"), "-")
        value = head.get("value")
        shown = f"{value:.4g}" if isinstance(value, float) else value  # a ratio, not 17 digits
        if isinstance(value, dict):  # counts (doctor_truth): "quiet 12, loaded 12, ..."
            shown = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in value.items())
        rows.append(f"| {head.get('label', data['name'])} | {data['machine']} | {str(data.get('date', '-'))[:10]} | {shown} "
                    f"| {head.get('goal') or '-'} | {met} | `{data.get('command', '')}` |")
    return "\n".join(rows)


def update_readme() -> None:
    text = README.read_text()
    if START not in text or END not in text:
        print(f"README has no {START} ... {END} markers; table not written")
        return
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{table()}\n{END}{tail}")
    print("README performance table updated")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    failed = []
    if not args.table_only:
        for script, extra in BENCHMARKS + (GPU_BENCHMARKS if _has_cuda() else []):
            if args.only and Path(script).stem not in args.only:
                continue
            if not (HERE / script).exists():
                print(f"skip {script}: not written yet")
                continue
            print(f"== {script}", flush=True)
            if subprocess.run([sys.executable, str(HERE / script), *extra]).returncode:
                failed.append(script)
    update_readme()
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
