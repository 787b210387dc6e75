"""Profiler windows: what a configured window costs outside itself, and what profiling costs inside.

1. Hot path (goal: ratio <= 1.02): the Monitor's own per-step work (four phase contexts and
   mon.step, no model) with no window vs with a window configured far ahead (closed). The
   phase hooks are installed only while a window is open, so the only difference is one
   attribute test per step.
2. Inside the window (no goal, for the docs): a tiny-MLP step outside vs inside an open
   torch.profiler window with trainspeed.<phase> ranges. Those steps are marked warm-up, so
   throughput figures never include this cost.

    python benchmarks/profile_window.py [--rounds 8] [--steps 400]
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
from harness import ab_compare, median, write_result  # noqa: E402

from trainspeed.telemetry.monitor import Monitor  # noqa: E402

PHASES = ("data", "forward", "backward", "optimizer")


def hot_path_round(run_dir: Path, steps: int, profile_steps: str | None) -> list[float]:
    mon = Monitor(run_dir, log_every=50, warmup_steps=0, system_sampler=False, write_env=False,
                  profile_steps=profile_steps)
    phases = [mon.phase(p) for p in PHASES]
    times = []
    t0 = time.perf_counter()
    for _ in range(steps):
        for ctx in phases:
            with ctx:
                pass
        mon.step(samples=1, loss=0.5)
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    mon.close()
    return times


def mlp_steps(run_dir: Path, steps: int, window: str | None) -> list[float]:
    """Per-step times of the steps inside `window` (or of the same steps without a window)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    mon = Monitor(run_dir, log_every=50, warmup_steps=0, system_sampler=False, write_env=False,
                  profile_steps=window)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        with mon.phase("forward"):
            loss = nn.functional.cross_entropy(model(x), y)
        with mon.phase("backward"):
            loss.backward()
        with mon.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        mon.step(samples=64, loss=loss)
        if 3 <= i < steps - 2:  # steps 4..steps-2 form the window; the rest is set-up/export
            times.append(time.perf_counter() - t0)
    mon.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--window-steps", type=int, default=20)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ts-bench-profile-"))
    counter = iter(range(10**6))
    hot = ab_compare(
        "profile_window_hot_path",
        lambda: hot_path_round(tmp / f"h{next(counter)}", args.steps, None),
        lambda: hot_path_round(tmp / f"h{next(counter)}", args.steps, "1000000-1000001"),
        rounds=args.rounds, labels=("no_window", "window_configured_closed"),
    )
    n = args.window_steps
    window = f"4-{n + 1}"
    inside = ab_compare(
        "profile_window_inside",
        lambda: mlp_steps(tmp / f"m{next(counter)}", n + 3, None),
        lambda: mlp_steps(tmp / f"m{next(counter)}", n + 3, window),
        rounds=max(2, args.rounds // 2), labels=("no_profiler", "inside_window"),
    )
    hot_us = median([hot["no_window"]["median_step_s"]]) * 1e6
    print(f"Monitor hot path {hot_us:.1f} us/step; ratio closed-window/no-window = {hot['ratio']:.4f} "
          f"(goal <= 1.02); tiny-MLP step inside a window / outside = {inside['ratio']:.2f}")
    write_result("profile_window", {"hot_path": hot, "inside_window": inside,
                                    "hot_path_us_per_step": hot_us}, headline={
        "label": "Profiler window configured but closed: Monitor per-step cost ratio",
        "value": round(hot["ratio"], 4), "goal": "<= 1.02", "passed": hot["ratio"] <= 1.02})


if __name__ == "__main__":
    main()
