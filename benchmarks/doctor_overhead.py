"""Overhead of the doctor's instrumentation on a plain training loop.

A: the loop as written. B: the same loop with every doctor hook installed (phase timing,
batch inspection, sync counting, call sites, Monitor writing steps.jsonl). A and B alternate in
one process (benchmarks/harness.py), and the headline is the ratio of median step times.
Goal: B/A <= 1.03.

    python benchmarks/doctor_overhead.py [--rounds 10] [--steps 50] [--width 1024] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset  # noqa: E402

from harness import ab_compare, write_result  # noqa: E402

GOAL = 1.03


def build(width: int, batch: int):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(batch * 64, 256), torch.randint(0, 10, (batch * 64,)))
    # batch-at-a-time indexing: the loader itself is cheap, as in a well-tuned loop
    loader = DataLoader(data, sampler=BatchSampler(RandomSampler(data), batch, drop_last=True), batch_size=None)
    model = nn.Sequential(nn.Linear(256, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                          nn.Linear(width, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return loader, model, opt


def loop(loader, model, opt, steps: int) -> list[float]:
    """The plain loop; returns per-step wall times."""
    times: list[float] = []
    it = iter(loader)
    for step in range(steps):
        t0 = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 49:
            loss.item()  # the usual log-interval read
        times.append(time.perf_counter() - t0)
    return times


def instrumented(loader, model, opt, steps: int, run_root: Path) -> list[float]:
    from trainspeed.doctor.instrument import Session, install
    from trainspeed.telemetry.monitor import Monitor

    run_dir = Path(tempfile.mkdtemp(dir=run_root))
    mon = Monitor(run_dir, log_every=20, warmup_steps=0, system_sampler=False, kind="doctor",
                  config={"command": ["benchmark"]})
    session = Session(mon, max_steps=None)
    handle = install(session)
    try:
        return loop(loader, model, opt, steps)
    finally:
        handle.uninstall()
        mon.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50, help="steps per round and side")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loader, model, opt = build(args.width, args.batch)
    with tempfile.TemporaryDirectory(prefix="doctor-overhead-") as root:
        result = ab_compare(
            "doctor_overhead",
            lambda: loop(loader, model, opt, args.steps),
            lambda: instrumented(loader, model, opt, args.steps, Path(root)),
            rounds=args.rounds,
            labels=("plain", "doctor"),
        )
    ratio = result["ratio_of_rounds"]
    result["config"] = {"width": args.width, "batch": args.batch, "steps_per_round": args.steps,
                        "threads": torch.get_num_threads()}
    write_result("doctor_overhead", result, headline={
        "label": "doctor-instrumented / plain median step time (ratio of per-round medians)",
        "value": ratio, "goal": f"<= {GOAL}", "passed": ratio <= GOAL})
    print(f"doctor overhead: x{ratio:.4f} (goal <= {GOAL}) "
          f"plain {result['plain']['median_step_s'] * 1e3:.2f} ms, doctor {result['doctor']['median_step_s'] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
