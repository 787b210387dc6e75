"""GPU: what trainspeed costs at GPT-2 124M on the lent GPU (issue 31: the Trainer within 1 % of a
hand-written loop with the same switches, the Monitor within 0.5 %, the doctor within 3 %).

Workload: the gpt recipe's model at GPT-2 124M (vocab 50304, 1024 tokens, --batch windows),
bf16 autocast, torch.compile (default mode), fused AdamW, token windows already on the GPU.

1. Trainer vs hand loop vs hand loop + Monitor, in one process: the Trainer trains (config:
   bf16-mixed, compile, fused AdamW, logging every 50 steps, nan_policy=stop), and every
   --block of its steps a callback syncs the GPU and times that block, then runs --block steps
   of the hand loop and --block steps of the hand loop with the Monitor (phases, loader,
   mon.step(loss=...), CUDA events, its writer and sampler threads), in alternating order, on
   the Trainer's own model and optimizer, each block timed between two syncs. The first
   --skip blocks (compilation, warm-up) are left out; each side's figure is the median of its
   blocks' seconds per step, and each ratio is side / hand loop.
2. The doctor: benchmarks/scripts/gpu/gpt2_hand.py run plain and under `trainspeed doctor`,
   each in a fresh process, alternated (plain, doctor, plain, doctor with --rounds 2), the
   script timing itself in blocks; the ratio of the medians of the steady blocks.

    python benchmarks/gpu_overhead.py [--batch 32] [--blocks 8] [--block 10] [--rounds 1]
    python benchmarks/gpu_overhead.py --small     # a tiny model on any device: the wiring only

Without CUDA (and without --small) it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import write_result  # noqa: E402

from trainspeed.engine.events import Callback  # noqa: E402
from trainspeed.engine.trainer import Trainer  # noqa: E402
from trainspeed.recipes.gpt.model import GPT, GPTOptions, flops_per_token, lm_loss  # noqa: E402
from trainspeed.telemetry.monitor import Monitor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOALS = {"trainer": 1.01, "monitor": 1.005, "doctor": 1.03}


class Windows(Dataset):
    """Token windows already on the device: (x, y) shifted by one."""

    def __init__(self, n: int, block: int, vocab: int, device: str) -> None:
        g = torch.Generator(device=device).manual_seed(0)
        self.data = torch.randint(0, vocab, (n, block + 1), device=device, generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        row = self.data[i]
        return row[:-1], row[1:]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Blocks(Callback):
    """Every `block` Trainer steps: time the Trainer's block, then a block of each hand side."""

    def __init__(self, dataset, batch: int, block: int, device: str, out: Path) -> None:
        self.block, self.device = block, device
        self.loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=False, drop_last=True)
        self.it = iter(self.loader)
        self.times: dict[str, list[float]] = {"trainer": [], "hand": [], "monitor": []}
        self.mark: float | None = None
        self.steps = 0
        self.mon = Monitor(out, log_every=50, warmup_steps=0, device=torch.device(device))
        self.mon_it = self.mon.loader(self._batches())
        self.flip = False

    def _batches(self):
        while True:
            yield self._next()

    def _next(self):
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            return next(self.it)

    def on_fit_start(self, state):
        self.model, self.opt = state.trainer.model, state.trainer.optimizer
        sync(self.device)
        self.mark = time.perf_counter()

    def _hand(self) -> None:
        x, y = self._next()
        with torch.autocast(self.device, dtype=torch.bfloat16):
            loss = self.model(x, targets=y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def _monitored(self) -> None:
        mon = self.mon
        x, y = next(self.mon_it)
        with mon.phase("forward"), torch.autocast(self.device, dtype=torch.bfloat16):
            loss = self.model(x, targets=y)
        with mon.phase("backward"):
            loss.backward()
        with mon.phase("optimizer"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        mon.step(samples=x.shape[0], loss=loss)

    def _timed(self, name: str, fn) -> None:
        sync(self.device)
        t0 = time.perf_counter()
        for _ in range(self.block):
            fn()
        sync(self.device)
        self.times[name].append((time.perf_counter() - t0) / self.block)

    def on_batch_end(self, state):
        self.steps += 1
        if self.steps % self.block:
            return
        sync(self.device)
        self.times["trainer"].append((time.perf_counter() - self.mark) / self.block)
        sides = [("hand", self._hand), ("monitor", self._monitored)]
        for name, fn in (reversed(sides) if self.flip else sides):
            self._timed(name, fn)
        self.flip = not self.flip
        sync(self.device)
        self.mark = time.perf_counter()


def in_process(args, out: Path) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    opts = (GPTOptions(size="tiny", block_size=64) if args.small
            else GPTOptions(size="gpt2", block_size=1024, vocab_size=50304))
    torch.manual_seed(0)
    model = GPT(opts)
    data = Windows(args.batch * 16, opts.block_size, opts.vocab_size, device)
    blocks = Blocks(data, args.batch, args.block, device, out / "monitor")
    steps = args.block * (args.blocks + args.skip)
    cfg = {"run": {"out_dir": str(out), "name": "trainer", "max_steps": steps, "device": device},
           # the windows already live on the GPU: nothing to pin (pinning a CUDA tensor raises)
           "data": {"batch_size": args.batch, "shuffle": False, "drop_last": True, "pin_memory": False,
                    "num_workers": 0},
           "precision": {"mode": "bf16-mixed"}, "compile": {"mode": "off" if args.small else "default"},
           "optim": {"implementation": "fused" if device == "cuda" else "foreach"},
           "logging": {"progress": False, "every": 50}, "nan_policy": "stop",
           "checkpoint": {"save_final": False}, "eval": {"at_end": False}}
    Trainer(model, lm_loss, data, config=cfg, callbacks=[blocks], flops_per_token=flops_per_token(model)).fit()
    blocks.mon.close()
    kept = {name: t[args.skip:] for name, t in blocks.times.items()}
    med = {name: statistics.median(t) for name, t in kept.items() if t}
    return {"device": device, "blocks": kept, "s_per_step": med,
            "trainer_ratio": med["trainer"] / med["hand"], "monitor_ratio": med["monitor"] / med["hand"]}


def doctor_side(args, out: Path) -> dict:
    script = ROOT / "benchmarks" / "scripts" / "gpu" / "gpt2_hand.py"
    steps = args.block * (args.blocks + args.skip)
    extra = ["--small"] if args.small else []
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs: dict[str, list[float]] = {"plain": [], "doctor": []}
    for r in range(args.rounds):
        for side in ("plain", "doctor"):
            times = out / f"{side}-{r}.jsonl"
            cmd = ["python", str(script), "--steps", str(steps), "--batch", str(args.batch),
                   "--block", str(args.block), "--times", str(times), *extra]
            if side == "doctor":
                cmd = [sys.executable, "-m", "trainspeed", "doctor", "--steps", str(steps), "--no-html",
                       "--out", str(out / f"doctor-{r}"), "--", *cmd]
            else:
                cmd[0] = sys.executable
            print("$", " ".join(cmd[-8:]) if side == "plain" else "trainspeed doctor ... " + script.name, flush=True)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            rows = [json.loads(line) for line in times.read_text().splitlines()] if times.exists() else []
            if not rows:
                return {"error": f"{side} run wrote no times (exit {proc.returncode})",
                        "log_tail": (proc.stdout + proc.stderr)[-2000:]}
            runs[side] += [row["s_per_step"] for row in rows[args.skip:]]
    med = {side: statistics.median(t) for side, t in runs.items()}
    return {"blocks": runs, "s_per_step": med, "doctor_ratio": med["doctor"] / med["plain"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32, help="windows of 1024 tokens per step")
    ap.add_argument("--block", type=int, default=10, help="steps per timed block")
    ap.add_argument("--blocks", type=int, default=8, help="timed blocks per side (after --skip)")
    ap.add_argument("--skip", type=int, default=2, help="first blocks left out (compilation, warm-up)")
    ap.add_argument("--rounds", type=int, default=1, help="plain/doctor process pairs")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per doctor-side process")
    ap.add_argument("--small", action="store_true", help="tiny model, any device: the wiring only")
    ap.add_argument("--no-doctor", action="store_true", help="skip the doctor side")
    args = ap.parse_args()
    if not args.small and not torch.cuda.is_available():
        print("gpu_overhead: no CUDA device here (--small checks the wiring anywhere)", file=sys.stderr)
        return 2
    out = Path(tempfile.mkdtemp(prefix="ts-gpu-overhead-"))
    results: dict = {"settings": vars(args)}
    results["engine"] = engine = in_process(args, out)
    print(f"Trainer / hand loop {engine['trainer_ratio']:.4f}, hand + Monitor / hand loop {engine['monitor_ratio']:.4f} "
          f"({ {k: round(v * 1e3, 2) for k, v in engine['s_per_step'].items()} } ms/step)", flush=True)
    if not args.no_doctor:
        results["doctor"] = doc = doctor_side(args, out)
        print(f"doctor / plain {doc.get('doctor_ratio') or doc.get('error')}", flush=True)
    ratios = {"trainer": engine["trainer_ratio"], "monitor": engine["monitor_ratio"],
              "doctor": (results.get("doctor") or {}).get("doctor_ratio")}
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    met = all(r is not None and r <= GOALS[k] for k, r in ratios.items())
    label = (f"GPT-2 124M on {device}: Trainer {ratios['trainer']:.3f}x, Monitor {ratios['monitor']:.3f}x, "
             f"doctor {ratios['doctor'] or float('nan'):.3f}x the hand loop's step time")
    if args.small:
        print(f"--small (wiring only, no verdict): {label}")
        return 0
    write_result("gpu_overhead", results, headline={"label": label, "value": {k: round(v, 4) if v else v
                                                                              for k, v in ratios.items()},
                                                    "goal": "trainer <= 1.01, monitor <= 1.005, doctor <= 1.03",
                                                    "passed": met})
    return 0


if __name__ == "__main__":
    sys.exit(main())
