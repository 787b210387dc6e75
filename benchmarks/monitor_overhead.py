"""Monitor overhead: a tiny-MLP loop (~5 ms steps on CPU) with vs without the Monitor.

Goal (issue 2): median step-time ratio <= 1.01. Both sides do identical work; the monitored
side adds loader wrapping, four phase contexts, mon.step(loss=tensor) and the JSONL sink on
its background thread (the default configuration).

    python benchmarks/monitor_overhead.py [--rounds 10] [--steps 200]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ab_compare, write_result  # noqa: E402

from trainspeed.telemetry.monitor import Monitor  # noqa: E402


def make_work(hidden: int, batch: int, steps: int):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                          nn.Linear(hidden, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [(torch.randn(batch, 256), torch.randint(0, 10, (batch,))) for _ in range(steps)]
    return model, opt, data


def plain_round(model, opt, data):
    times = []
    t0 = time.perf_counter()
    for x, y in data:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    return times


def monitored_round(model, opt, data, run_dir):
    mon = Monitor(run_dir, log_every=50, warmup_steps=0, system_sampler=True, write_env=False)
    times = []
    t0 = time.perf_counter()
    for x, y in mon.loader(data):
        with mon.phase("forward"):
            loss = nn.functional.cross_entropy(model(x), y)
        with mon.phase("backward"):
            loss.backward()
        with mon.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        mon.step(samples=x.shape[0], loss=loss)
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    mon.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    model, opt, data = make_work(args.hidden, args.batch, args.steps)
    tmp = Path(tempfile.mkdtemp(prefix="ts-bench-"))
    counter = iter(range(10**6))
    res = ab_compare(
        "monitor_overhead",
        lambda: plain_round(model, opt, data),
        lambda: monitored_round(model, opt, data, tmp / f"r{next(counter)}"),
        rounds=args.rounds, labels=("hand_loop", "with_monitor"),
    )
    res["step_ms"] = res["hand_loop"]["median_step_s"] * 1e3
    ratio = res["ratio"]
    print(f"median step {res['step_ms']:.2f} ms; ratio with/without Monitor = {ratio:.4f} (goal <= 1.01)")
    write_result("monitor_overhead", res, headline={
        "label": "Monitor overhead (tiny MLP, ~5 ms steps, step-time ratio)",
        "value": round(ratio, 4), "goal": "<= 1.01", "passed": ratio <= 1.01})


if __name__ == "__main__":
    main()
