"""Write schema-1 run directories directly, for cases a short CPU run cannot produce:
CUDA memory fields, a slowdown that starts mid-run, thousands of steps, malformed lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

PHASES = ("data", "h2d", "forward", "backward", "optimizer", "log", "ckpt", "eval", "other")


def step_records(n: int = 400, *, slowdown_at: int | None = 250, cuda: bool = True, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        growth = 1.0 + (0.002 * (i - slowdown_at) if slowdown_at is not None and i >= slowdown_at else 0.0)
        ph = {"data": 0.004 * growth, "h2d": 0.0005, "forward": 0.006, "backward": 0.011,
              "optimizer": 0.002, "log": 0.0004, "ckpt": 0.0, "eval": 0.0}
        ph = {k: v * float(rng.uniform(0.9, 1.1)) for k, v in ph.items()}
        ph["other"] = 0.0006
        t = sum(ph.values())
        mem: dict[str, Any] = {"rss": 900e6 + 1e5 * i, "worker_rss": 300e6}
        if cuda:
            mem.update(cuda_alloc_peak=2.1e9 + 1e6 * i, cuda_reserved_peak=3.0e9, cuda_alloc_retries=0)
        out.append({
            "schema": 1, "step": i, "t_wall": 1.7e9 + i * t, "t_step": t, "phases": ph,
            "samples": 32, "tokens": 4096, "pad_share": 0.3 + 0.05 * np.sin(i / 20),
            "loss": (3.0 * np.exp(-i / 150) + 0.5) if i % 10 == 9 else None, "lr": 1e-3,
            "mem": mem, "syncs": 0, "warmup": i < 5, "rank": 0,
        })
    return out


def write_run(run_dir: Path, records: list[dict], *, summary: dict | None = None,
              findings: list[dict] | None = None, extra_step_lines: list[str] = (),
              device: str = "cuda:0", write_report: bool = True) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "env.json").write_text(json.dumps({"schema": 1, "python": "3.11", "torch": "2.13.0",
                                                  "devices": [device]}))
    (run_dir / "config.yaml").write_text("model:\n  hidden: 64\nbatch_size: 32\n")
    lines = [json.dumps(r) for r in records]
    # Insert the extra (possibly malformed) lines in the middle, as a crashing writer would not.
    mid = len(lines) // 2
    lines = lines[:mid] + list(extra_step_lines) + lines[mid:]
    (run_dir / "steps.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "events.jsonl").write_text(json.dumps(
        {"schema": 1, "type": "run_start", "step": 0, "t_wall": 1.7e9,
         "data": {"device": device, "precision": "bf16", "flops_per_step": 1e12}}) + "\n")
    if write_report:
        if summary is None:
            from trainspeed.telemetry.rundir import read_run
            from trainspeed.telemetry.summary import summarize

            summary = summarize(read_run(run_dir))
        (run_dir / "report.json").write_text(json.dumps(
            {"schema": 1, "kind": "train", "summary": summary, "findings": findings or [], "traceback": None}))
    return run_dir
