"""Planted GPU cause: memory near the limit. Another tensor (all the free memory but --headroom
x one step's measured need) stays allocated for the whole run, and the activations of each
step, larger than the last's, no longer fit beside the cached blocks: the caching allocator
frees its cache and retries cudaMalloc (allocator retries), a device-wide sync each time.
bf16 autocast; a smaller --batch-size is the fix.

    python memory_limit.py --steps 100 [--batch-size 4096] [--headroom 1.15] [--small]
"""
import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100)
p.add_argument("--batch-size", type=int, default=8192, help="the largest batch; each step takes 1/2-1x of it")
p.add_argument("--headroom", type=float, default=1.15, help="memory left free, in steps' measured needs")
p.add_argument("--small", action="store_true")
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
width, reference = (64, 16) if args.small else (4096, 8192)
batch = min(args.batch_size, reference) if not args.small else 16
torch.manual_seed(0)
model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.GELU())], nn.Linear(width, 10)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")


def step(n):
    x = torch.randn(n, width, device=device)
    y = torch.randint(0, 10, (n,), device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


hold = None
if device == "cuda":
    # Another tenant of the GPU takes all but --headroom x what one step at the reference batch
    # needs, whatever --batch-size is: the memory this run can use is fixed. The need is read on
    # the second step, over what stays allocated between steps (weights, gradients, AdamW's
    # state): the first step creates that state after its peak, and reading the need there
    # left it out (an OOM on an H100, at headroom 1.6 too).
    step(reference)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step(reference)
    torch.cuda.synchronize()
    need = torch.cuda.max_memory_allocated() - base
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    hold = torch.empty(max(0, free - int(args.headroom * need)), dtype=torch.uint8, device=device)
ramp = 16
for i in range(args.steps):
    # Batches grow step by step from half the batch to all of it, then start again (a sampler
    # that sorts by length): each step's tensors are larger than the cached blocks of the last,
    # so the allocator asks the driver for more, and near the limit it frees its cache and
    # retries. (Random sizes retried only on the steps larger than the one before, about half:
    # a smaller request is served by splitting a cached block.)
    loss = step(batch // 2 + (batch // 2) * (i % ramp) // (ramp - 1))
retries = torch.cuda.memory_stats().get("num_alloc_retries", 0) if device == "cuda" else 0
print(f"final loss {loss.item():.4f}; allocator retries {retries}")
