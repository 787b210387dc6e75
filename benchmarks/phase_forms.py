"""Phase forms: what writing a step's phases as `with mon.phase(...)` blocks costs, against the
same marks written as `mon.mark((time, code))` in try/finally (the Trainer's form), in one
process, step by step.

Why it exists: the Trainer stopped using `with` blocks on its hot path. On CPython 3.11 each
`with` calls a Python __enter__ and __exit__; right after torch ops, where Python code runs
with cold caches, those calls are what the Monitor's overhead is made of, while a list append
costs next to nothing. Sides, all on the same model, optimizer and batches (like
monitor_overhead.py): the hand-written step twice (A/A: the noise floor), monitor_overhead's
monitored step (loader, three `with` blocks, mon.step with the loss), and the same step with
the three phases written as marks. Each phase side has its own Monitor (no sinks, no sampler),
so the difference between them is the phase form alone. Informational: no goal.

    python benchmarks/phase_forms.py [--trials 5] [--steps 1500]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleave_sides, trials_summary, write_result  # noqa: E402
from monitor_overhead import make_side, monitored_step, plain_step, workload_args  # noqa: E402

from trainspeed.telemetry.monitor import Monitor  # noqa: E402
from trainspeed.telemetry.phase_context import phase_codes  # noqa: E402

FORWARD, FORWARD_END = phase_codes("forward")
BACKWARD, BACKWARD_END = phase_codes("backward")
OPTIMIZER, OPTIMIZER_END = phase_codes("optimizer")


def marks_step(model, opt, batches, mon):
    """monitor_overhead.monitored_step with its three `with` blocks written as marks."""
    clock = time.perf_counter

    loader = mon.loader(batches)

    def step():
        x, y = next(loader)
        mark = mon.mark
        mark((clock(), FORWARD))
        try:
            loss = nn.functional.cross_entropy(model(x), y)
        finally:
            mark((clock(), FORWARD_END))
        mark((clock(), BACKWARD))
        try:
            loss.backward()
        finally:
            mark((clock(), BACKWARD_END))
        mark((clock(), OPTIMIZER))
        try:
            opt.step()
            opt.zero_grad(set_to_none=True)
        finally:
            mark((clock(), OPTIMIZER_END))
        mon.step(samples=x.shape[0], loss=loss)
    return step


def main() -> None:
    args = workload_args().parse_args()
    trials = []
    for t in range(args.trials):
        mons = [Monitor(None, sinks=(), log_every=50, warmup_steps=0, system_sampler=False) for _ in range(2)]
        side = make_side(args.hidden, args.batch, 1 + t)
        trials.append(interleave_sides({"hand_loop": plain_step(*side), "hand_loop_again": plain_step(*side),
                                        "with_blocks": monitored_step(*side, mons[0]),
                                        "marks": marks_step(*side, mons[1])}, args.steps, seed=t))
        for mon in mons:
            mon.close()
        last = trials_summary(trials[-1:], "hand_loop", "hand_loop_again")
        print(f"  [phase_forms] trial {t + 1}/{args.trials}: step {last['hand_loop']['median_step_s'] * 1e3:.2f} ms, "
              f"with blocks +{last['with_blocks']['median_paired_diff_us']:.0f} µs, marks "
              f"+{last['marks']['median_paired_diff_us']:.0f} µs, A/A {last['hand_loop_again']['median_paired_diff_us']:+.0f} µs",
              flush=True)
    res = trials_summary(trials, "hand_loop", "hand_loop_again")
    with_us, marks_us = res["with_blocks"]["median_paired_diff_us"], res["marks"]["median_paired_diff_us"]
    res["with_minus_marks_us"] = [round(w - m, 1) for w, m in zip(res["with_blocks"]["trial_paired_diff_us"],
                                                                  res["marks"]["trial_paired_diff_us"])]
    print(f"median step {res['hand_loop']['median_step_s'] * 1e3:.2f} ms; per step over the hand loop: "
          f"with blocks {with_us:.0f} µs, marks {marks_us:.0f} µs (A/A "
          f"{res['hand_loop_again']['median_paired_diff_us']:+.0f} µs); with - marks by trial: {res['with_minus_marks_us']}")
    write_result("phase_forms", res, headline={
        "label": f"Monitor (loader, three phases, step) per step, µs over the hand loop ({res['hand_loop']['median_step_s'] * 1e3:.1f} ms "
                 f"steps, median of {args.trials} trials): `with mon.phase` blocks vs mon.mark in try/finally",
        "value": f"with {with_us:.0f} µs, marks {marks_us:.0f} µs", "goal": None, "passed": None})


if __name__ == "__main__":
    main()
