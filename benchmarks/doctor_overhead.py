"""Overhead of the doctor's instrumentation on a plain training loop.

A: the loop as written. B: the same loop (its own model copy and loader) with every doctor
hook installed (phase timing, batch inspection, sync counting, call sites, Monitor writing
steps.jsonl). A and B steps alternate one by one in a seeded random order; the hooks are
installed just before each B step and removed after it, outside the timed region (installing
is a one-time cost in a real run; what is measured is what the hooks cost inside a step).
The headline is the ratio of median step times. Goal: B/A <= 1.03.

The doctor's system sampler (a thread reading /proc 4 times a second: this process tree's and
the machine's CPU, so that other processes' load is evidence) costs outside the hooks, so it is
measured apart: blocks of plain steps with the sampler running vs not, alternated in a seeded
order, the sampler started and stopped between blocks (outside the timing). Its ratio counts
against the same 3 % budget, together with the hooks'.

    python benchmarks/doctor_overhead.py [--steps 600] [--width 1024] [--threads 1]
        [--sampler-blocks 16] [--sampler-interval 0.25]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset  # noqa: E402

from harness import interleave_steps, paired_summary, timed_steps, write_result  # noqa: E402

GOAL = 1.03
WARMUP = 20  # pairs dropped: allocator warm-up, the hooks' first calls


def build(width: int, batch: int):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(batch * 64, 256), torch.randint(0, 10, (batch * 64,)))
    # batch-at-a-time indexing: the loader itself is cheap, as in a well-tuned loop
    loader = DataLoader(data, sampler=BatchSampler(RandomSampler(data), batch, drop_last=True), batch_size=None)
    model = nn.Sequential(nn.Linear(256, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                          nn.Linear(width, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return loader, model, opt


def stepper(loader, model, opt):
    """One step of the plain loop per call (the loss read at a 50-step log interval)."""
    state = {"it": iter(loader), "n": 0}

    def step() -> None:
        try:
            x, y = next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            x, y = next(state["it"])
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        state["n"] += 1
        if state["n"] % 50 == 0:
            loss.item()  # the usual log-interval read
    return step


def measure(args, run_root: Path) -> tuple[list[float], list[float]]:
    from trainspeed.doctor.instrument import Session, install
    from trainspeed.telemetry.monitor import Monitor

    plain = stepper(*build(args.width, args.batch))
    doctored = stepper(*build(args.width, args.batch))
    mon = Monitor(run_root, log_every=20, warmup_steps=0, system_sampler=False, kind="doctor",
                  config={"command": ["benchmark"]})
    session = Session(mon, max_steps=None)

    @contextlib.contextmanager
    def hooks_installed():
        handle = install(session)
        try:
            yield
        finally:
            handle.uninstall()

    try:
        return interleave_steps(plain, doctored, args.steps, warmup=WARMUP, b_around=hooks_installed)
    finally:
        mon.close()


def measure_sampler(args) -> tuple[list[float], list[float]]:
    """(step times without, with) the sampler, over alternated blocks of plain steps."""
    import random

    from trainspeed.telemetry.sampler import SystemSampler

    step = stepper(*build(args.width, args.batch))
    for _ in range(WARMUP):
        step()
    off: list[float] = []
    on: list[float] = []
    rng = random.Random(0)
    per_block = max(10, args.steps // max(1, args.sampler_blocks))
    for _ in range(args.sampler_blocks // 2):
        for with_sampler in rng.sample([False, True], 2):
            sampler = SystemSampler(interval_s=args.sampler_interval) if with_sampler else None
            if sampler:
                sampler.start()
            times = timed_steps(step, per_block)
            if sampler:
                sampler.stop()
            (on if with_sampler else off).extend(times[2:])  # the block's first steps see the start
    return off, on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="steps per side")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--sampler-blocks", type=int, default=16, help="alternated blocks (0: skip)")
    parser.add_argument("--sampler-interval", type=float, default=0.25, help="seconds between rows (the doctor's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="doctor-overhead-") as root:
        a, b = measure(args, Path(root))
    result = paired_summary(a, b, ("plain", "doctor"))
    ratio = result["ratio"]
    sampler_ratio = None
    if args.sampler_blocks:
        off, on = measure_sampler(args)
        sampler_ratio = statistics.median(on) / statistics.median(off)
        result["sampler"] = {"interval_s": args.sampler_interval, "blocks": args.sampler_blocks,
                             "median_step_s_off": statistics.median(off), "median_step_s_on": statistics.median(on),
                             "ratio": sampler_ratio}
        print(f"sampler every {args.sampler_interval:g} s: x{sampler_ratio:.4f} "
              f"({statistics.median(off) * 1e3:.2f} -> {statistics.median(on) * 1e3:.2f} ms)")
    total = ratio * (sampler_ratio or 1.0)
    result["config"] = {"width": args.width, "batch": args.batch, "steps_per_side": args.steps,
                        "threads": torch.get_num_threads()}
    write_result("doctor_overhead", result, headline={
        "label": f"doctor-instrumented / plain median step time ({result['plain']['median_step_s'] * 1e3:.0f} ms "
                 f"steps; {result['median_paired_diff_us']:.0f} µs per step)",
        "value": round(ratio, 4), "sampler_ratio": round(sampler_ratio, 4) if sampler_ratio else None,
        "hooks_and_sampler": round(total, 4), "goal": f"<= {GOAL}", "passed": total <= GOAL})
    print(f"doctor overhead: x{ratio:.4f} (goal <= {GOAL}) plain {result['plain']['median_step_s'] * 1e3:.2f} ms, "
          f"doctor {result['doctor']['median_step_s'] * 1e3:.2f} ms; {result['median_paired_diff_us']:.0f} µs per step")


if __name__ == "__main__":
    main()
