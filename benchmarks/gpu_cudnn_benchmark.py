"""GPU: does torch.backends.cudnn.benchmark = True make fixed-shape conv nets faster here?

Six small conv nets (bf16 autocast and fp32; 3x3, 5x5 and 7x7 kernels; a grouped conv; 56 to 128
pixels; 64 to 256 channels), each trained with the autotuner off and on, alternated twice (off,
on, off, on), 5 warm-up then 20 timed steps, the best of the two rounds of each side. The doctor's
cudnn_benchmark_off check reads this: where cuDNN's own heuristics already pick what the
autotuner picks, the finding is a thing to measure, not a warning with a share at stake.

    python benchmarks/gpu_cudnn_benchmark.py        # needs CUDA; about 25 s on an H100
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import write_result  # noqa: E402

NETS = [  # name, channels, side, batch, kernel, autocast dtype (None: fp32)
    ("5x5 bf16 (cudnn_off.py)", 128, 128, 64, 5, torch.bfloat16), ("5x5 fp32", 128, 128, 64, 5, None),
    ("7x7 bf16", 64, 112, 64, 7, torch.bfloat16), ("96 channels, 100 px, 5x5 bf16", 96, 100, 32, 5, torch.bfloat16),
    ("7x7 fp32", 64, 112, 64, 7, None), ("256 channels 3x3 bf16", 256, 56, 64, 3, torch.bfloat16),
]


def step_ms(channels: int, side: int, batch: int, k: int, dtype, benchmark: bool) -> float:
    torch.backends.cudnn.benchmark = benchmark
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
                      nn.Conv2d(channels, channels, k, padding=k // 2), nn.BatchNorm2d(channels), nn.ReLU(),
                      nn.Conv2d(channels, channels, 3, padding=1, groups=4), nn.BatchNorm2d(channels), nn.ReLU(),
                      nn.Conv2d(channels, channels, k, padding=k // 2), nn.BatchNorm2d(channels), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10)).to("cuda")
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, side, side, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / 20 * 1e3


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_cudnn_benchmark: no CUDA device here", file=sys.stderr)
        return 2
    results = {}
    for name, ch, side, batch, k, dtype in NETS:
        times = {False: [], True: []}
        for benchmark in (False, True, False, True):
            times[benchmark].append(step_ms(ch, side, batch, k, dtype, benchmark))
        off, on = min(times[False]), min(times[True])
        results[name] = {"off_ms": round(off, 2), "on_ms": round(on, 2), "speedup": round(off / on, 3)}
        print(f"conv {name}: benchmark off {off:.2f} ms, on {on:.2f} ms: {off / on:.2f}x", flush=True)
    torch.backends.cudnn.benchmark = False
    best = max(r["speedup"] for r in results.values())
    results["cudnn"] = torch.backends.cudnn.version()
    write_result("gpu_cudnn_benchmark", results, headline={
        "label": f"cudnn.benchmark=True on {len(NETS)} fixed-shape conv nets, best speedup "
                 f"(cuDNN {results['cudnn']}, {torch.cuda.get_device_name(0)})",
        "value": round(best, 3), "goal": "a measurement (the doctor warns only where it wins)", "passed": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
