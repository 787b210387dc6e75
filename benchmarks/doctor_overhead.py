"""Overhead of the doctor's instrumentation on a plain training loop.

A: the loop as written. B: the same loop (its own model copy and loader) with every doctor
hook installed (phase timing, batch inspection, sync counting, call sites, Monitor writing
steps.jsonl). A and B steps alternate one by one in a seeded random order; the hooks are
installed just before each B step and removed after it, outside the timed region (installing
is a one-time cost in a real run; what is measured is what the hooks cost inside a step).
The headline is the ratio of median step times. Goal: B/A <= 1.03.

    python benchmarks/doctor_overhead.py [--steps 600] [--width 1024] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset  # noqa: E402

from harness import interleave_steps, paired_summary, write_result  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="steps per side")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="doctor-overhead-") as root:
        a, b = measure(args, Path(root))
    result = paired_summary(a, b, ("plain", "doctor"))
    ratio = result["ratio"]
    result["config"] = {"width": args.width, "batch": args.batch, "steps_per_side": args.steps,
                        "threads": torch.get_num_threads()}
    write_result("doctor_overhead", result, headline={
        "label": f"doctor-instrumented / plain median step time ({result['plain']['median_step_s'] * 1e3:.0f} ms "
                 f"steps; {result['median_paired_diff_us']:.0f} µs per step)",
        "value": round(ratio, 4), "goal": f"<= {GOAL}", "passed": ratio <= GOAL})
    print(f"doctor overhead: x{ratio:.4f} (goal <= {GOAL}) plain {result['plain']['median_step_s'] * 1e3:.2f} ms, "
          f"doctor {result['doctor']['median_step_s'] * 1e3:.2f} ms; {result['median_paired_diff_us']:.0f} µs per step")


if __name__ == "__main__":
    main()
