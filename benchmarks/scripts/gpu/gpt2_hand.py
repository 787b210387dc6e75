"""A hand-written GPT-2 124M training loop (bf16 autocast, torch.compile, fused AdamW, data on
the device), the workload of benchmarks/gpu_overhead.py: run plain and under the doctor, it
times itself in blocks of steps (a CUDA sync at each block's end, as a loop that logs every
--block steps would) and appends each block's per-step time to --times, so a run the doctor
stops after its --steps still leaves its figures.

    python gpt2_hand.py --steps 120 --times times.jsonl [--batch 32] [--small]
"""
import argparse
import json
import time

import torch

from trainspeed.recipes.gpt.attention_order import cuda_capability_major, sdpa_order
from trainspeed.recipes.gpt.model import GPT, GPTOptions

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=120)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--block", type=int, default=10, help="steps per timed block")
p.add_argument("--times", default=None, help="append each block's seconds per step here (JSON lines)")
p.add_argument("--small", action="store_true", help="a tiny model on whatever device there is (wiring)")
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
opts = GPTOptions(size="tiny", block_size=64) if args.small else GPTOptions(size="gpt2", block_size=1024,
                                                                            vocab_size=50304)
model = GPT(opts).to(device)
model.use_sdpa_order(sdpa_order("auto", cuda_capability_major(device)))
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device == "cuda")
step_fn = torch.compile(model) if device == "cuda" else model
data = torch.randint(0, opts.vocab_size, (8, args.batch, opts.block_size + 1), device=device)
dtype = torch.bfloat16
t0 = time.perf_counter()
for step in range(args.steps):
    batch = data[step % len(data)]
    x, y = batch[:, :-1], batch[:, 1:]
    with torch.autocast(device, dtype=dtype):
        loss = step_fn(x, targets=y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if (step + 1) % args.block == 0:
        value = loss.item()  # the block's end: a sync, as logging would
        t1 = time.perf_counter()
        if args.times:
            with open(args.times, "a") as f:
                f.write(json.dumps({"step": step + 1, "s_per_step": (t1 - t0) / args.block, "loss": value}) + "\n")
        t0 = t1
