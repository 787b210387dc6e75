"""Data parallel on the CPU: one process with batch 2b vs 2 gloo ranks (DDP, FSDP, DeepSpeed) with batch b.

Sides: one process using every core, one process with one thread (the per-rank compute of
the 2-rank sides without any communication), DDP, FSDP and DeepSpeed ZeRO stages 0-3 with
2 ranks of cores/2 threads.

Same global batch, same samples, same model (the gpt recipe), so the sides differ only in how
the work is split: one process using all cores for its matmuls, or two processes with one
thread each that all-reduce (DDP, ZeRO 0) or all-gather / reduce-scatter (FSDP, ZeRO 1-3)
every step. Each side is a real `trainspeed train` run (torchrun for the 2-rank sides); its step
times come from the run directory's steps.jsonl (rank 0, warm-up excluded; each rank's median
from steps.jsonl and ranks/rank1/steps.jsonl is kept beside it). Sides take turns round by round
(harness.compare_many), medians over all rounds.

Memory per rank (the CPU has no allocator counters, so it is each process's resident set):
`rss_peak_sampled_mb`, the largest RSS the run directory records for the rank (its system
sampler, every 1 s, and the step records' mem.rss at each log interval), and `rss_hwm_mb`, the
kernel's high-water mark of the rank's RSS (getrusage ru_maxrss, read at exit by a
sitecustomize this script puts on the ranks' PYTHONPATH), which no sampling can miss. Machine
load: `others_load_cores`, the CPU other processes used during the side's run (the sampler's
cpu_others less the job's other ranks), in cores, next to the 1-minute load average before and
after the benchmark.

This is not a claim that data parallelism is faster on 2 cores (it rarely is): it is the
measured cost of the distributed machinery on this machine, which the docs quote.

    python benchmarks/distributed.py [--rounds 3] [--steps 30] [--batch 16]
    (the DeepSpeed sides run with .cache/torch_extensions, where `make venv` built DeepSpeed's
    CPU comm op, and this Python's bin first on PATH; without DeepSpeed they are skipped)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import compare_many, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
# DeepSpeed JIT-builds a small CPU op; `make venv` builds it here, with the venv's ninja (another
# ninja would rebuild it, a minute on 2 cores).
TORCH_EXTENSIONS = ROOT / ".cache" / "torch_extensions"
ZERO_STAGES = (0, 1, 2, 3)

# Put on the ranks' PYTHONPATH: at exit, each trainspeed process writes the kernel's high-water
# mark of its resident set (the torchrun agent, also a Python process, writes nothing).
SITECUSTOMIZE = """
import atexit, json, os, resource, sys

def _write_hwm():
    out = os.environ.get("BENCH_HWM_DIR")
    if out and "trainspeed" in (sys.argv[0] if sys.argv else ""):
        rank = os.environ.get("RANK", "0")
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"rss_hwm": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}, f)

atexit.register(_write_hwm)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _rank_dirs(run: Path) -> list[Path]:
    """Rank 0's directory (the run's), then ranks/rank1, ... in rank order."""
    others = sorted((run / "ranks").glob("rank*"), key=lambda p: int(p.name[4:])) if (run / "ranks").is_dir() else []
    return [run, *others]


def _rss_peak(rank_dir: Path) -> float | None:
    """The largest RSS this rank's run directory records: the system sampler's maximum (the
    `system` event) and mem.rss of the step records (read at each log interval)."""
    seen = [r["mem"]["rss"] for r in _jsonl(rank_dir / "steps.jsonl") if (r.get("mem") or {}).get("rss")]
    seen += [e["data"]["rss_max"] for e in _jsonl(rank_dir / "events.jsonl")
             if e.get("type") == "system" and e["data"].get("rss_max")]
    return max(seen) if seen else None


def _others_load(rank_dirs: list[Path]) -> float | None:
    """CPU that processes outside the job used during the run, in cores: each rank's sampler
    counts the job's other ranks among 'others', so their own CPU is taken off again."""
    system = []
    for d in rank_dirs:
        got = [e["data"] for e in _jsonl(d / "events.jsonl") if e.get("type") == "system"]
        if not got or got[-1].get("cpu_others_mean") is None:
            return None
        system.append(got[-1])
    tree_total = sum(s["cpu_tree_mean"] for s in system)
    outside = [s["cpu_others_mean"] - (tree_total - s["cpu_tree_mean"]) for s in system]
    return max(0.0, statistics.median(outside)) / 100


def run_side(work: Path, name: str, strategy: str, batch: int, steps: int, threads: int,
             extra: list[dict], zero_stage: int | None = None) -> list[float]:
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
    if zero_stage is not None:
        cmd.append(f"distributed.zero_stage={zero_stage}")
    hwm_dir = work / "hwm" / name
    hwm_dir.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "BENCH_HWM_DIR": str(hwm_dir),
           "PYTHONPATH": os.pathsep.join([str(work / "site"), str(SRC)]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    if TORCH_EXTENSIONS.is_dir():
        env.setdefault("TORCH_EXTENSIONS_DIR", str(TORCH_EXTENSIONS))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    dirs = _rank_dirs(out / name)
    per_rank = [[r["t_step"] for r in _jsonl(d / "steps.jsonl") if not r.get("warmup")] for d in dirs]
    hwm = [hwm_dir / f"rank{rank}.json" for rank in range(len(dirs))]
    extra.append({
        "rank_median_step_s": [statistics.median(t) for t in per_rank],
        "rss_peak_sampled": [_rss_peak(d) for d in dirs],
        "rss_hwm": [json.loads(p.read_text())["rss_hwm"] if p.exists() else None for p in hwm],
        "others_load_cores": _others_load(dirs),
    })
    return per_rank[0]


def _summarize(rounds: list[dict]) -> dict:
    """Per-rank figures of one side over its rounds: median step time, and the largest RSS."""
    ranks = range(len(rounds[0]["rank_median_step_s"]))
    mb = 1 / 2**20

    def peak(key: str) -> list[float | None]:
        return [round(max(vals) * mb, 1) if (vals := [r[key][i] for r in rounds if r[key][i]]) else None
                for i in ranks]

    loads = [r["others_load_cores"] for r in rounds if r["others_load_cores"] is not None]
    return {
        "rank_median_step_s": [statistics.median(r["rank_median_step_s"][i] for r in rounds) for i in ranks],
        "rss_peak_sampled_mb": peak("rss_peak_sampled"),
        "rss_hwm_mb": peak("rss_hwm"),
        "others_load_cores": [round(x, 2) if x is not None else None for x in (r["others_load_cores"] for r in rounds)],
        "others_load_cores_median": round(statistics.median(loads), 2) if loads else None,
    }


def _has_deepspeed() -> bool:
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16, help="global batch (per rank: half of it)")
    args = ap.parse_args()
    cores = os.cpu_count() or 2
    per_rank_threads = max(1, cores // 2)
    started = time.perf_counter()
    counter = iter(range(10_000))
    extras: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "site").mkdir()
        (work / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)

        def side(label: str, strategy: str, threads: int, zero_stage: int | None = None):
            extra = extras.setdefault(label, [])
            return label, lambda: run_side(work, f"{strategy}-{next(counter)}", strategy, args.batch,
                                           args.steps, threads, extra, zero_stage)

        sides = [
            side(f"1 process x {cores} threads", "none", cores),
            side("1 process x 1 thread", "none", 1),
            side(f"DDP 2 ranks x {per_rank_threads} threads", "ddp", per_rank_threads),
            side(f"FSDP 2 ranks x {per_rank_threads} threads", "fsdp", per_rank_threads),
        ]
        if _has_deepspeed():
            sides += [side(f"DeepSpeed ZeRO-{z} 2 ranks x {per_rank_threads} threads", "deepspeed",
                           per_rank_threads, z) for z in ZERO_STAGES]
        else:
            print("DeepSpeed is not installed: its sides are skipped")
        load_before = os.getloadavg()
        results = compare_many("distributed", dict(sides), rounds=args.rounds, warmup_rounds=0)
    labels = [k for k in results if isinstance(results[k], dict)]
    for label in labels:
        results[label]["samples_per_s"] = args.batch / results[label]["median_step_s"]
        results[label].update(_summarize(extras[label]))
    results["global_batch"] = args.batch
    results["steps_per_run"] = args.steps
    results["fields"] = {
        "median_step_s": "rank 0's step times, warm-up excluded, median over all rounds",
        "rank_median_step_s": "each rank's median step time in one run, median over rounds",
        "rss_peak_sampled_mb": "per rank: the largest RSS its run directory records (system sampler "
                               "every 1 s, step records at each log interval), MiB, max over rounds",
        "rss_hwm_mb": "per rank: the kernel's high-water mark of its RSS (ru_maxrss at exit), MiB, "
                      "max over rounds",
        "others_load_cores": "per round: CPU used by processes outside the run while it ran, in cores",
    }
    results["wall_s"] = round(time.perf_counter() - started, 1)
    # A loaded machine changes the picture (oversubscribed OpenMP threads wait for each other
    # at every op), so the load is part of the result.
    results["loadavg_1min_before_after"] = [load_before[0], os.getloadavg()[0]]
    ddp_ratio = results[f"ratio_{labels[2]}"]
    write_result("distributed", results, headline={
        "label": "DDP 2 ranks / 1 process median step time, same global batch (informational)",
        "value": ddp_ratio, "goal": None, "passed": None})
    for label in labels:
        r = results[label]
        print(f"{label}: median step {r['median_step_s'] * 1e3:.1f} ms, {r['samples_per_s']:.0f} samples/s, "
              f"peak RSS per rank {r['rss_hwm_mb']} MiB (sampled {r['rss_peak_sampled_mb']}), "
              f"others' load {r['others_load_cores_median']} cores")


if __name__ == "__main__":
    main()
