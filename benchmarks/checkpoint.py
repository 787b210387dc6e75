"""Checkpoint blocking time: async (host copy, background write) vs sync (write on the caller).

A ~100M-parameter model (six 4096x4096 linear layers, fp32, ~400 MB) is checkpointed through
CheckpointManager with async_save=False and async_save=True, alternated round by round
(ABAB...) into the same directory on the same disk. "Blocking" is the time save() keeps the
training thread: the whole atomic, fsynced write for sync; the copy to host memory for async
(the write then runs on the background thread; its time is recorded too). Between async saves
the benchmark waits for the write to finish, as training would between checkpoints, so the
async figure never includes waiting for a previous write.

Goal (issue 4): median async/sync blocking-time ratio <= 0.2.

    python benchmarks/checkpoint.py [--rounds 4] [--width 4096] [--layers 6] [--optimizer]
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

from trainspeed.engine.checkpoint import CheckpointManager, build_checkpoint  # noqa: E402


def make_state(width: int, layers: int, with_optimizer: bool):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    opt = None
    if with_optimizer:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model(torch.randn(2, width)).sum().backward()
        opt.step()
    n_params = sum(p.numel() for p in model.parameters())
    return model, opt, n_params


def one_save(mgr: CheckpointManager, model, opt, step: int, events: list) -> dict:
    state = build_checkpoint(model, opt)
    t0 = time.perf_counter()
    result = mgr.save(state, step)
    blocking = time.perf_counter() - t0
    mgr.wait()  # training would run here; a later save must not wait for this write
    event = [e for e in events if e.get("type") == "checkpoint" and e.get("ckpt_step") == step][-1]
    return {"blocking_s": blocking, "reported_blocking_s": result.blocking_s,
            "write_s": event["write_s"], "bytes": event["bytes"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--optimizer", action="store_true", help="include AdamW state (3x the bytes)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir under /tmp)")
    args = ap.parse_args()

    model, opt, n_params = make_state(args.width, args.layers, args.optimizer)
    print(f"model: {n_params / 1e6:.1f}M parameters, optimizer state: {args.optimizer}", flush=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        events: list = []
        managers = {
            "sync": CheckpointManager(Path(tmp) / "sync", keep_last=1, async_save=False,
                                      on_event=events.append),
            "async": CheckpointManager(Path(tmp) / "async", keep_last=1, async_save=True,
                                       on_event=events.append),
        }
        samples: dict[str, list[dict]] = {"sync": [], "async": []}
        step = 0
        for kind in ("sync", "async"):  # warm-up: page cache, allocator, lazy imports
            step += 1
            one_save(managers[kind], model, opt, step, events)
        ratios = []
        for r in range(args.rounds):
            order = ("sync", "async") if r % 2 == 0 else ("async", "sync")
            got = {}
            for kind in order:
                step += 1
                got[kind] = one_save(managers[kind], model, opt, step, events)
                samples[kind].append(got[kind])
            ratios.append(got["async"]["blocking_s"] / got["sync"]["blocking_s"])
            print(f"  round {r + 1}/{args.rounds}: sync blocks {got['sync']['blocking_s']:.3f} s, "
                  f"async blocks {got['async']['blocking_s']:.3f} s "
                  f"(its background write {got['async']['write_s']:.3f} s), ratio {ratios[-1]:.3f}",
                  flush=True)
        for mgr in managers.values():
            mgr.close()

    def med(kind: str, key: str) -> float:
        return statistics.median(s[key] for s in samples[kind])

    ratio = med("async", "blocking_s") / med("sync", "blocking_s")
    results = {
        "params": n_params,
        "optimizer_state": args.optimizer,
        "checkpoint_bytes": samples["sync"][0]["bytes"],
        "sync": {"median_blocking_s": med("sync", "blocking_s"), "median_write_s": med("sync", "write_s")},
        "async": {"median_blocking_s": med("async", "blocking_s"),
                  "median_background_write_s": med("async", "write_s")},
        "ratio_blocking_async_over_sync": ratio,
        "ratio_of_rounds": statistics.median(ratios),
        "rounds": args.rounds,
    }
    print(f"async/sync blocking-time ratio = {ratio:.3f} (goal <= 0.2)")
    write_result("checkpoint", results, headline={
        "label": f"Checkpoint blocking time, async vs sync ({n_params / 1e6:.0f}M params, ratio)",
        "value": round(ratio, 3), "goal": "<= 0.2", "passed": ratio <= 0.2})


if __name__ == "__main__":
    main()
