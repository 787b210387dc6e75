"""Per-step instructions and cache misses of the hot paths, counted by callgrind: figures that
the machine's load does not move, for a change to the Monitor or the Trainer on a machine too noisy to time them.

monitor_overhead.py and engine_overhead.py time the steps: on this 2-core shared VM their A/A
floor moves by 5-30 µs between trials, the size of the change being judged. Under callgrind
(valgrind's instruction-level simulator) the same step runs the same instructions whatever
the machine's load, but not whatever the addresses: without setarch -R two runs of one side
differed by ~5k instructions and ~1k L2 misses a step (hash tables keyed by address, MKL's
code paths). So the address space is fixed (setarch -R, PYTHONHASHSEED=0) and every workload
runs twice, in two processes (hand_again, engine_hand_again): that A/A difference is the floor
a change must clear. Each side runs in its own process: `math.comb` at the end of step K zeroes the counts
(--zero-before=math_comb) and `math.perm` at the end of step K + N dumps them
(--dump-before=math_perm), so the dump holds exactly N steps of the main thread
(--separate-threads: the writer thread runs on another core and is left out).
K starts past the Monitor's first flushes (their imports) and the window falls between two
log intervals, as the timed benchmarks' medians do. The system sampler is off on every side:
callgrind simulates one cache for all threads, and under its ~50x slowdown the time-driven
sampler would wake ~50x more often per step than it does in a timed run, and its misses would
land on the main thread's count.

Figures per step: instructions (Ir), L1 instruction and data misses, last-level misses (a
simulated 32 KiB L1 and 1 MiB L2), and cycles estimated as Ir + 12 x L1 misses + 40 x L2
misses: right after torch's kernels the interpreter's code and data are cold, and the misses
are most of a small step's cost (the Trainer's ~29k extra instructions a step came with ~2.8k
extra L1 and ~0.8k extra L2 misses: two thirds of its estimated extra cycles). The estimate ranks changes; the timed benchmarks give
the µs.

Sides: hand (monitor_overhead's hand loop), null (its loop shape on a do-nothing Monitor),
monitor (the Monitor as monitor_overhead runs it, less the sampler), engine_hand
(engine_overhead's hand loop with its own DataLoader), trainer (the Trainer on the same
workload), and hand_again / engine_hand_again (the A/A controls).

    python benchmarks/step_instructions.py [--sides hand,hand_again,monitor,...] [--steps 45]

Needs valgrind (apt install valgrind); a side takes 3-6 minutes on the 2-core machine, and
sides run two at a time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
SIDES = ("hand", "hand_again", "null", "monitor", "engine_hand", "engine_hand_again", "trainer")
DEFAULT_SIDES = ("hand", "hand_again", "monitor", "engine_hand", "engine_hand_again", "trainer")
START = 152  # past the first flushes at steps 50-150 (log_every 50); the window ends before 200
HIDDEN, BATCH = 256, 32  # smaller than the timed benchmarks': callgrind runs ~50x slower


def cycles(per_step: dict[str, float]) -> float:
    """Estimated cycles: each L1 miss that hits L2 ~12 cycles, each L2 miss ~40 (see docstring)."""
    l1 = per_step["I1mr"] + per_step["D1mr"] + per_step["D1mw"]
    l2 = per_step["ILmr"] + per_step["DLmr"] + per_step["DLmw"]
    return per_step["Ir"] + 12 * (l1 - l2) + 40 * l2


def read_dump(path: Path) -> dict[str, int]:
    """The event totals of one callgrind dump file."""
    names: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith("totals:") or line.startswith("summary:"):
            return dict(zip(names, (int(x) for x in line.split()[1:])))
    raise RuntimeError(f"{path}: no totals line (did the side reach step {START} + steps?)")


def run_side(side: str, steps: int, workdir: Path) -> dict[str, float]:
    """Run one side under callgrind; its main thread's counts per step."""
    out = workdir / f"cg.{side}"
    # setarch -R: the same addresses in every run (hash tables keyed by address, MKL's paths)
    cmd = [*(["setarch", platform.machine(), "-R"] if shutil.which("setarch") else []), "valgrind", "--tool=callgrind", "--separate-threads=yes", "--zero-before=math_comb",
           "--dump-before=math_perm", "--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64",
           "--LL=1048576,16,64", f"--callgrind-out-file={out}",
           sys.executable, __file__, "--child", side, "--steps", str(steps)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts in every run
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"side {side} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    dumps = sorted(workdir.glob(f"cg.{side}.1-01"))  # dump 1 (math_perm), thread 1 (main)
    if not dumps:
        raise RuntimeError(f"side {side}: no dump at step {START + steps}; files: "
                           f"{sorted(p.name for p in workdir.glob(f'cg.{side}*'))}")
    totals = read_dump(dumps[0])
    return {name: totals.get(name, 0) / steps for name in EVENTS}


def child(side: str, steps: int) -> None:
    """The side's loop in this process (run under callgrind by run_side)."""
    import torch

    torch.set_num_threads(1)  # one thread: callgrind serializes threads, and spin-waits would count

    def at(step: int) -> None:
        if step == START:
            math.comb(5, 2)  # zero the counts (--zero-before=math_comb)
        elif step == START + steps:
            math.perm(5, 2)  # dump them (--dump-before=math_perm)

    last = START + steps + 1
    side = side.removesuffix("_again")  # the A/A control: the same side in another process
    if side in ("engine_hand", "trainer"):
        from torch.utils.data import TensorDataset

        import engine_overhead as eo

        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(4096, 256, generator=g), torch.randint(0, 10, (4096,), generator=g))
        model = eo.make_model(HIDDEN)
        if side == "engine_hand":
            hand = eo.HandSteps(data, BATCH, 1)
            hand.model, hand.opt = model, eo.make_opt(model)
            for s in range(1, last + 1):
                hand()
                at(s)
            return
        import trainspeed.telemetry.monitor as monitor_module
        from trainspeed.engine.events import Callback
        from trainspeed.engine.trainer import Trainer

        make_sampler = monitor_module.make_sampler  # the Trainer has no switch for it: off here (docstring)
        monitor_module.make_sampler = lambda _on, *a, **k: make_sampler(False, *a, **k)

        class At(Callback):
            def on_batch_end(self, state):
                at(state.step)

        cfg = {"run": {"out_dir": tempfile.mkdtemp(prefix="ts-cg-"), "name": "r", "max_steps": last},
               "data": {"batch_size": BATCH, "shuffle": True}, "logging": {"progress": False},
               "checkpoint": {"save_final": False}, "eval": {"at_end": False}}
        Trainer(model, eo.loss_fn, data, optimizer=eo.make_opt(model), config=cfg, callbacks=[At()]).fit()
        return
    import monitor_overhead as mo

    side_args = mo.make_side(HIDDEN, BATCH, 1)
    if side == "hand":
        step = mo.plain_step(*side_args)
    elif side == "null":
        step = mo.monitored_step(*side_args, mo.NullMonitor())
    else:
        from trainspeed.telemetry.monitor import Monitor

        mon = Monitor(Path(tempfile.mkdtemp(prefix="ts-cg-")), log_every=50, warmup_steps=0,
                      system_sampler=False, write_env=False)
        step = mo.monitored_step(*side_args, mon)
    for s in range(1, last + 1):
        step()
        at(s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sides", default=",".join(DEFAULT_SIDES), help=f"of {', '.join(SIDES)}")
    ap.add_argument("--steps", type=int, default=45, help="steps counted per side (the window ends before step 200)")
    ap.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.steps)
        return
    if shutil.which("valgrind") is None:
        sys.exit("step_instructions.py needs valgrind: apt install valgrind")
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = sorted(set(sides) - set(SIDES))
    if unknown:
        sys.exit(f"unknown side(s) {', '.join(unknown)}; sides are {', '.join(SIDES)}")
    with tempfile.TemporaryDirectory(prefix="ts-callgrind-") as tmp:
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            futures = {s: pool.submit(run_side, s, args.steps, Path(tmp)) for s in sides}
            per_step = {s: f.result() for s, f in futures.items()}
    from harness import write_result

    res: dict[str, dict[str, float]] = {}
    for s, counts in per_step.items():
        res[s] = {**{k: round(v, 1) for k, v in counts.items()}, "cycles_est": round(cycles(counts))}
    pairs = [("hand_again", "hand"), ("monitor", "hand"), ("null", "hand"), ("monitor", "null"),
             ("engine_hand_again", "engine_hand"), ("trainer", "engine_hand")]
    for side, base in pairs:
        if side in res and base in res:
            res[f"{side}-{base}"] = {k: round(res[side][k] - res[base][k], 1) for k in (*EVENTS, "cycles_est")}
    for name, row in res.items():
        print(f"{name:20s} Ir {row['Ir']:>11,.0f}  L1 misses {row['I1mr'] + row['D1mr'] + row['D1mw']:>8,.0f}  "
              f"L2 misses {row['ILmr'] + row['DLmr'] + row['DLmw']:>7,.0f}  cycles~ {row['cycles_est']:>11,.0f}")
    headline = {"label": f"main-thread instructions per step under callgrind ({args.steps} steps from step {START}; "
                         "monitor - hand, trainer - engine_hand; A/A: the same side in two processes)",
                "value": ", ".join(f"{k}: {res[k]['Ir']:+,.0f} Ir, {res[k]['cycles_est']:+,.0f} cycles~"
                                   for k in ("monitor-hand", "hand_again-hand", "trainer-engine_hand",
                                             "engine_hand_again-engine_hand") if k in res),
                "goal": "fewer than before the change being judged", "passed": None}
    write_result("step_instructions", res, headline=headline)


if __name__ == "__main__":
    main()
