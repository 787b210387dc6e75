"""GPU: the gpt recipe at GPT-2 124M size with bf16 + torch.compile + fused AdamW, tokens/s and
MFU on the lent GPU, next to the naive config of the same model (issue 3's GPU goal:
MFU >= 45 % on H100/H200).

Each run is `trainspeed train gpt` in a fresh subprocess; MFU is the engine's own figure
(analytic FLOPs per token x tokens/s over the datasheet peak for bf16), warm-up and
compilation excluded. Needs CUDA; on a machine without it, it says so and exits 2.

    python benchmarks/gpu_mfu.py [--steps 120] [--batch 16] [--block 1024]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import write_result  # noqa: E402

SWITCHES = {
    "naive": ["precision.mode=fp32", "compile.mode=off", "optim.implementation=loop", "logging.every=1"],
    "fast": ["precision.mode=bf16-mixed", "compile.mode=default", "optim.implementation=fused",
             "data.pin_memory=true", "data.device_prefetch=true", "logging.every=50"],
}


def run(variant: str, args: argparse.Namespace, out: Path) -> dict:
    name = f"gpt2-{variant}"
    cmd = [sys.executable, "-m", "trainspeed", "train", "gpt", "--variant=fast", "--no-report",
           "recipe.options.size=gpt2", f"recipe.options.block_size={args.block}",
           f"data.batch_size={args.batch}", f"run.max_steps={args.steps}", "run.device=cuda",
           f"run.out_dir={out}", f"run.name={name}", "logging.progress=false", "eval.at_end=false",
           "logging.warmup_steps=20", *SWITCHES[variant]]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)
    summary = json.loads((out / name / "report.json").read_text())["summary"]
    mfu = summary.get("mfu") or {}
    return {"tokens_per_s": summary.get("tokens_per_s"), "mfu": mfu.get("value"), "mfu_valid": mfu.get("valid"),
            "peak": mfu.get("peak_name"), "step_p50_s": summary["step_time"]["p50"],
            "memory": summary.get("memory"), "loss_last": (summary.get("loss") or {}).get("last")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=1024)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_mfu: no CUDA device on this machine; run it where a GPU is present", file=sys.stderr)
        return 2
    out = Path(tempfile.mkdtemp(prefix="ts-gpu-mfu-"))
    results = {variant: run(variant, args, out) for variant in ("naive", "fast")}
    fast, naive = results["fast"], results["naive"]
    results["speedup"] = fast["tokens_per_s"] / naive["tokens_per_s"]
    results["device"] = torch.cuda.get_device_name(0)
    mfu = fast["mfu"] or 0.0
    print(f"{results['device']}: fast {fast['tokens_per_s']:,.0f} tokens/s, MFU {mfu:.1%}; "
          f"naive {naive['tokens_per_s']:,.0f} tokens/s ({results['speedup']:.2f}x)")
    write_result("gpu_mfu", results, headline={
        "label": f"gpt 124M bf16+compile+fused MFU ({results['device']})",
        "value": round(mfu, 3), "goal": ">= 0.45", "passed": mfu >= 0.45})
    return 0


if __name__ == "__main__":
    sys.exit(main())
