"""GPU: every built-in recipe's fast variant on the lent GPU, its MFU and throughput (issue 29:
"every recipe's GPU MFU reported"; no goal: gpt's goal is benchmarks/gpu_mfu.py's).

Each run is `trainspeed train RECIPE --variant=fast run.device=cuda` in a fresh subprocess, so
the recipe's fast-cuda.yaml (bf16, compile where the recipe compiles, fused AdamW, pinned memory
and device prefetch, its CUDA batch size) is what is measured, at the recipe's default size; the
warm-up (and compile) steps are excluded. Each run keeps what gpu_mfu.py keeps (figures()). MFU is the engine's own figure (the recipe's FLOPs, or
torch's FLOP counter over one step, over the device's datasheet peak for the run's dtype).

    python benchmarks/gpu_recipes.py [--recipes gpt,convnext,seqvae,hf] [--steps 60]

Needs CUDA; without it, it says so and exits 2. A recipe whose run fails is reported with its
error and the others still run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_mfu import figures  # noqa: E402
from harness import write_result  # noqa: E402


def run(recipe: str, steps: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "trainspeed", "train", recipe, "--variant=fast", "--no-report",
           f"run.max_steps={steps}", "run.device=cuda", f"run.out_dir={out}", f"run.name={recipe}",
           "logging.progress=false", "eval.at_end=false", "eval.every_steps=null",
           f"logging.warmup_steps={max(5, steps // 4)}"]
    print("$", " ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = round(time.perf_counter() - t0, 1)
    report = out / recipe / "report.json"
    if proc.returncode != 0 or not report.exists():
        return {"error": f"exit {proc.returncode}", "log_tail": (proc.stdout + proc.stderr)[-2000:], "wall_s": wall}
    summary = json.loads(report.read_text())["summary"]
    return {**figures(summary), "samples_per_s": summary.get("samples_per_s"), "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", default="gpt,convnext,seqvae,hf")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_recipes: no CUDA device on this machine; run it where a GPU is present", file=sys.stderr)
        return 2
    out = Path(tempfile.mkdtemp(prefix="ts-gpu-recipes-"))
    device = torch.cuda.get_device_name(0)
    results: dict = {"device": device, "steps": args.steps}
    for recipe in args.recipes.split(","):
        results[recipe] = r = run(recipe, args.steps, out)
        text = r.get("error") or (f"MFU {r['mfu']:.1%}" if isinstance(r.get("mfu"), float) else "MFU not measured")
        print(f"{recipe}: {text}, {r.get('tokens_per_s') or r.get('samples_per_s') or 0:,.0f} "
              f"{'tokens' if r.get('tokens_per_s') else 'samples'}/s ({r['wall_s']} s)", flush=True)
        write_result("gpu_recipes", results, headline=headline(results, args.recipes.split(","), device))
    return 0


def headline(results: dict, recipes: list[str], device: str) -> dict:
    shown = ", ".join(f"{r} {results[r]['mfu']:.1%}" if isinstance((results.get(r) or {}).get("mfu"), float)
                      else f"{r} {'failed' if 'error' in (results.get(r) or {}) else 'n/a'}" for r in recipes)
    ran = all("error" not in (results.get(r) or {"error": 1}) for r in recipes)
    return {"label": f"every recipe's fast variant on {device}: MFU", "value": shown,
            "goal": "each runs and reports its MFU", "passed": ran}


if __name__ == "__main__":
    sys.exit(main())
