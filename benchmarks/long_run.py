"""Long run: 50,000 steps logging every step to JSONL + TensorBoard through the sinks.

Goal (issue 2): the median step time of the last 1,000 steps within 3 % of steps
1,000-2,000 — logging must not make training slower as the run grows (the classic bug: a
list of every loss kept for the log, or a writer that re-reads its history).

On a shared VM the wall-clock ratio also moves with the machine: windows minutes apart can
differ by 5-30 % in either direction for identical work. Two diagnostics are reported next to
it: the training thread's CPU time late/early (time the hypervisor or other processes take is
not in it, growth in our own work is), and the trend detector's verdict on the whole run.

    python benchmarks/long_run.py [--steps 50000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import write_result  # noqa: E402

from trainspeed.telemetry.monitor import Monitor  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--sinks", default="jsonl,tensorboard")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # leave the second core to the writer thread, as a real run would
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    run_dir = Path(tempfile.mkdtemp(prefix="ts-long-")) / "run"
    mon = Monitor(run_dir, log_every=1, warmup_steps=0, sinks=tuple(args.sinks.split(",")),
                  write_env=False)
    times = [0.0] * args.steps  # preallocated: the benchmark itself must not grow
    cpu_times = [0.0] * args.steps  # this thread's CPU time: blind to time the VM takes away
    t0 = time.perf_counter()
    c0 = time.thread_time()
    for i in range(args.steps):
        with mon.phase("forward"):
            loss = nn.functional.mse_loss(model(x), y)
        with mon.phase("backward"):
            loss.backward()
        with mon.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        mon.step(samples=16, loss=loss, lr=1e-3)
        t1 = time.perf_counter()
        c1 = time.thread_time()
        times[i] = t1 - t0
        cpu_times[i] = c1 - c0
        t0, c0 = t1, c1
    summary = mon.close()
    stats = dict(mon.writer.stats)  # after close: everything submitted has been written
    trend = summary.get("trend")  # our own detector (telemetry/trend.py): a slowdown that stands out of noise
    early = statistics.median(times[1000:2000])
    late = statistics.median(times[-1000:])
    ratio = late / early
    cpu_ratio = statistics.median(cpu_times[-1000:]) / statistics.median(cpu_times[1000:2000])
    files = {p.name: p.stat().st_size for p in run_dir.rglob("*") if p.is_file()}
    with open(run_dir / "steps.jsonl", "rb") as f:
        stats["steps_in_file"] = sum(1 for _ in f)
    print(f"steps {args.steps}: early median {early * 1e6:.1f} us, late {late * 1e6:.1f} us, "
          f"ratio {ratio:.4f} (goal within 3 %); training-thread CPU time late/early {cpu_ratio:.4f}; "
          f"trend detector: {trend['message'] if trend else 'no slowdown'}; "
          f"writer {stats}")
    write_result("long_run", {
        "steps": args.steps, "sinks": args.sinks, "early_median_s": early, "late_median_s": late,
        "ratio": ratio, "cpu_time_ratio": cpu_ratio, "trend": trend, "writer": stats, "files_bytes": files,
    }, headline={"label": f"{args.steps:,} steps logging every step: late/early step time (training-thread "
                          f"CPU time late/early {cpu_ratio:.3f})",
                 "value": round(ratio, 4), "goal": "within 3 % (0.97-1.03)",
                 "passed": 0.97 <= ratio <= 1.03})


if __name__ == "__main__":
    main()
