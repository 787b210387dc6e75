"""Engine overhead: trainspeed's Trainer vs a hand-written loop vs PyTorch Lightning's Trainer,
same model, data, optimizer and switches, rotated in one process; per-step medians.

Goal (issue 3): Trainer / hand loop <= 1.02; report Trainer vs Lightning whatever it is.
Step time is measured the same way on every side: perf_counter between consecutive
optimizer steps (so data fetching and each framework's per-step bookkeeping count).

    python benchmarks/engine_overhead.py [--rounds 8] [--steps 150]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import compare_many, write_result  # noqa: E402

from trainspeed.engine.events import Callback  # noqa: E402
from trainspeed.engine.trainer import Trainer  # noqa: E402

SKIP = 5  # first steps of each round: allocator warm-up, FLOP counting, framework setup


def make_model(hidden: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, 10))


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def make_opt(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)


def hand_round(dataset, hidden, steps, batch):
    model = make_model(hidden)
    opt = make_opt(model)
    loader = DataLoader(dataset, batch_size=batch, shuffle=True)
    times, t0, n = [], time.perf_counter(), 0
    while n < steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t1 = time.perf_counter()
            times.append(t1 - t0)
            t0 = t1
            n += 1
            if n == steps:
                break
    return times[SKIP:]


class StepTimes(Callback):
    def __init__(self):
        self.times, self.t0 = [], None

    def on_batch_end(self, state):
        t1 = time.perf_counter()
        if self.t0 is not None:
            self.times.append(t1 - self.t0)
        self.t0 = t1


def trainspeed_round(dataset, hidden, steps, batch, out):
    model = make_model(hidden)
    timer = StepTimes()
    cfg = {"run": {"out_dir": str(out), "name": f"r{time.monotonic_ns()}", "max_steps": steps},
           "data": {"batch_size": batch, "shuffle": True},
           "logging": {"progress": False},
           "checkpoint": {"save_final": False}, "eval": {"at_end": False}}
    Trainer(model, loss_fn, dataset, optimizer=make_opt(model), config=cfg, callbacks=[timer]).fit()
    return timer.times[SKIP - 1:]


def lightning_round(dataset, hidden, steps, batch):
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make_model(hidden)

        def training_step(self, batch, _):
            return loss_fn(self.net, batch)

        def configure_optimizers(self):
            return make_opt(self.net)

    class Timer(L.Callback):
        def __init__(self):
            self.times, self.t0 = [], None

        def on_train_batch_end(self, *args):
            t1 = time.perf_counter()
            if self.t0 is not None:
                self.times.append(t1 - self.t0)
            self.t0 = t1

    timer = Timer()
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[timer], num_sanity_val_steps=0)
    trainer.fit(Module(), DataLoader(dataset, batch_size=batch, shuffle=True))
    return timer.times[SKIP - 1:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    g = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(4096, 256, generator=g), torch.randint(0, 10, (4096,), generator=g))
    out = Path(tempfile.mkdtemp(prefix="ts-engine-"))
    sides = {
        "hand_loop": lambda: hand_round(dataset, args.hidden, args.steps, args.batch),
        "trainspeed": lambda: trainspeed_round(dataset, args.hidden, args.steps, args.batch, out),
    }
    try:
        import lightning  # noqa: F401

        sides["lightning"] = lambda: lightning_round(dataset, args.hidden, args.steps, args.batch)
    except ImportError:
        print("lightning not installed: comparing with the hand loop only")
    res = compare_many("engine_overhead", sides, rounds=args.rounds)
    ratio = res["ratio_trainspeed"]
    print(f"trainspeed / hand loop = {ratio:.4f} (goal <= 1.02)")
    if "lightning" in sides:
        res["trainspeed_vs_lightning"] = res["trainspeed"]["median_step_s"] / res["lightning"]["median_step_s"]
        print(f"trainspeed / lightning = {res['trainspeed_vs_lightning']:.4f}")
    write_result("engine_overhead", res, headline={
        "label": "Trainer overhead vs hand-written loop (MLP, step-time ratio)"
                 + (f"; vs Lightning {res['trainspeed_vs_lightning']:.3f}" if "lightning" in sides else ""),
        "value": round(ratio, 4), "goal": "<= 1.02", "passed": ratio <= 1.02})


if __name__ == "__main__":
    main()
