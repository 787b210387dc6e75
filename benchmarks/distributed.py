"""Data parallel on the CPU: one process with batch 2b vs 2 gloo ranks (DDP, FSDP) with batch b.

Sides: one process using every core, one process with one thread (the per-rank compute of
the 2-rank sides without any communication), DDP and FSDP with 2 ranks of cores/2 threads.

Same global batch, same samples, same model (the gpt recipe), so the sides differ only in how
the work is split: one process using all cores for its matmuls, or two processes with one
thread each that all-reduce (DDP) or all-gather / reduce-scatter (FSDP) every step. Each side
is a real `trainspeed train` run (torchrun for the 2-rank sides); its step times come from the
run directory's steps.jsonl (rank 0, warm-up excluded). Sides take turns round by round
(harness.compare_many), medians over all rounds.

This is not a claim that data parallelism is faster on 2 cores (it rarely is): it is the
measured cost of the distributed machinery on this machine, which the docs quote.

    python benchmarks/distributed.py [--rounds 3] [--steps 30] [--batch 16]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import compare_many, write_result  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_side(work: Path, name: str, strategy: str, batch: int, steps: int, threads: int) -> list[float]:
    out = work / "runs"
    nproc = 1 if strategy == "none" else 2
    launch = [sys.executable]
    if nproc > 1:
        launch += ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_port())]
    cmd = launch + [
        "-m", "trainspeed", "train", "gpt", "--no-report", f"run.name={name}", f"run.out_dir={out}",
        f"distributed.strategy={strategy}", f"data.batch_size={batch // nproc}", f"run.max_steps={steps}",
        f"run.torch_threads={threads}", "recipe.options.block_size=128", "logging.every=10",
        "logging.warmup_steps=5", "logging.progress=false", "eval.at_end=false", "run.device=cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(SRC)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / name / "steps.jsonl").read_text().splitlines()]
    return [r["t_step"] for r in records if not r.get("warmup")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16, help="global batch (per rank: half of it)")
    args = ap.parse_args()
    cores = os.cpu_count() or 2
    per_rank_threads = max(1, cores // 2)
    counter = iter(range(10_000))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)

        def side(strategy: str, threads: int):
            return lambda: run_side(work, f"{strategy}-{next(counter)}", strategy, args.batch, args.steps, threads)

        load_before = os.getloadavg()
        results = compare_many("distributed", {
            f"1 process x {cores} threads": side("none", cores),
            "1 process x 1 thread": side("none", 1),
            f"DDP 2 ranks x {per_rank_threads} threads": side("ddp", per_rank_threads),
            f"FSDP 2 ranks x {per_rank_threads} threads": side("fsdp", per_rank_threads),
        }, rounds=args.rounds, warmup_rounds=0)
    labels = [k for k in results if isinstance(results[k], dict)]
    for label in labels:
        results[label]["samples_per_s"] = args.batch / results[label]["median_step_s"]
    results["global_batch"] = args.batch
    # A loaded machine changes the picture (oversubscribed OpenMP threads wait for each other
    # at every op), so the load is part of the result.
    results["loadavg_1min_before_after"] = [load_before[0], os.getloadavg()[0]]
    ddp_ratio = results[f"ratio_{labels[2]}"]
    write_result("distributed", results, headline={
        "label": "DDP 2 ranks / 1 process median step time, same global batch (informational)",
        "value": ddp_ratio, "goal": None, "passed": None})
    for label in labels:
        print(f"{label}: median step {results[label]['median_step_s'] * 1e3:.1f} ms, "
              f"{results[label]['samples_per_s']:.0f} samples/s")


if __name__ == "__main__":
    main()
