"""How much a fixed training step's time drifts on this machine with nothing in it changing.

The doctor judges a step time that grows over a run of a few hundred steps (seconds). On a
shared VM the machine's own speed moves over seconds (a neighbour on the host's cores, caches
and memory bandwidth), and the step's CPU time moves with its wall time, so no reading of
other processes' load shows it. This runs one unchanged step (the MLP of
tests/doctor/test_contention_stories.py, one thread) for --seconds, then slides windows of
--window steps (a doctor run's length) over it and reads each as the doctor does: the ratio
of the last quarter's median step time to the first's, and how far each phase's share of the
step moved (its 10th percentile, as phase_shares.phase_share_moves reads it). The doctor's
machine-drift rule (phase_shares.DRIFT_RATIO, DRIFT_SHARE) rests on these figures.

    python benchmarks/machine_drift.py [--seconds 120] [--window 160]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import write_result  # noqa: E402

from trainspeed.telemetry.phase_shares import DRIFT_RATIO, DRIFT_SHARE, phase_share_moves  # noqa: E402


def _steps(seconds: float) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(512, 256), torch.randint(0, 10, (512,))
    wall, cpu, phases = [], [], {"forward": [], "backward": [], "optimizer": []}
    clock, end = time.perf_counter, time.perf_counter() + seconds
    while clock() < end:
        t0, c0 = clock(), time.process_time()
        loss = nn.functional.cross_entropy(model(x), y)
        t1 = clock()
        opt.zero_grad()
        loss.backward()
        t2 = clock()
        opt.step()
        t3 = clock()
        wall.append(t3 - t0)
        cpu.append(time.process_time() - c0)
        phases["forward"].append(t1 - t0)
        phases["backward"].append(t2 - t1)
        phases["optimizer"].append(t3 - t2)
    return np.array(wall), {k: np.array(v) for k, v in phases.items()}, np.array(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--window", type=int, default=160)
    args = parser.parse_args()
    wall, phases, cpu = _steps(args.seconds)
    q = args.window // 4
    ratios, moves = [], []
    for start in range(0, wall.size - args.window + 1, q):
        w = wall[start:start + args.window]
        ratios.append(float(np.median(w[-q:]) / np.median(w[:q])))
        moved = phase_share_moves(w, {k: v[start:start + args.window] for k, v in phases.items()})
        moves.append(max(abs(m) for m in moved.values()))
    ratios_a, moves_a = np.array(ratios), np.array(moves)
    rises = np.maximum(ratios_a, 1.0 / ratios_a)  # a slowdown either way round
    results = {
        "steps": int(wall.size),
        "step_ms_median": float(np.median(wall) * 1e3),
        "cpu_over_wall": float(np.median(cpu / wall)),
        "window_steps": args.window,
        "windows": len(ratios),
        "quarter_ratio_p50": float(np.percentile(rises, 50)),
        "quarter_ratio_p95": float(np.percentile(rises, 95)),
        "quarter_ratio_max": float(rises.max()),
        "windows_over_1_2": int((rises >= 1.2).sum()),
        "windows_over_drift_ratio": int((rises >= DRIFT_RATIO).sum()),
        "share_move_p50": float(np.percentile(moves_a, 50)),
        "share_move_p95": float(np.percentile(moves_a, 95)),
        "share_move_max": float(moves_a.max()),
        "share_move_of_windows_over_1_2": [round(float(m), 3) for m in moves_a[rises >= 1.2]],
        "drift_ratio": DRIFT_RATIO,
        "drift_share": DRIFT_SHARE,
    }
    for key, value in results.items():
        print(f"{key}: {value}")
    write_result("machine_drift", results, headline=drift_headline(results))


def drift_headline(r: dict) -> dict:
    """The README table's row (label, value, goal; run_all.table): informational, no pass/fail."""
    return {"label": f"A fixed one-thread step on the idle VM, {r['window_steps']}-step windows: last/first quarter "
                     "median step time (the machine's own drift; shares of forward/backward/optimizer moved "
                     f"{r['share_move_max'] * 100:.1f} points at most)",
            "value": f"x{r['quarter_ratio_p50']:.2f} median, x{r['quarter_ratio_p95']:.2f} p95, "
                     f"x{r['quarter_ratio_max']:.2f} max",
            "goal": f"informational: the doctor's drift rule (x{r['drift_ratio']:g}, {r['drift_share'] * 100:g} points "
                    "of share)",
            "passed": None, "quarter_ratio_max": r["quarter_ratio_max"], "share_move_max": r["share_move_max"]}


if __name__ == "__main__":
    main()
