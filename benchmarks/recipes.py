"""Recipes: naive vs fast config of each built-in recipe on this machine, measured honestly.

Each trial is `trainspeed train RECIPE [--naive]` in a fresh subprocess (clean threads,
caches, memory); naive and fast alternate (ABAB...) to cancel machine drift; the figure is
the steady-state tokens/s (samples/s when a recipe has no tokens) from each run's
report.json, warm-up excluded. Speedup = median(fast) / median(naive), whatever it is.

    python benchmarks/recipes.py [--recipes gpt] [--rounds 3] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import write_result  # noqa: E402


def trial(recipe: str, variant: str, steps: int, out: Path, name: str) -> dict:
    cmd = [sys.executable, "-m", "trainspeed", "train", recipe, f"--variant={variant}", "--no-report",
           f"run.max_steps={steps}", f"run.out_dir={out}", f"run.name={name}",
           "logging.progress=false", "eval.at_end=false"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((out / name / "report.json").read_text())["summary"]
    rate = summary.get("tokens_per_s") or summary.get("samples_per_s")
    return {"rate": rate, "unit": "tokens/s" if summary.get("tokens_per_s") else "samples/s",
            "step_p50_s": summary["step_time"]["p50"],
            "phases": {k: v.get("share") for k, v in summary["phases"].items()},
            "loss_last": (summary.get("loss") or {}).get("last")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", default="gpt")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="ts-recipes-"))
    results: dict[str, dict] = {}
    for recipe in args.recipes.split(","):
        trials: dict[str, list[dict]] = {"naive": [], "fast": []}
        for r in range(args.rounds):
            order = ("naive", "fast") if r % 2 == 0 else ("fast", "naive")
            for variant in order:
                t = trial(recipe, variant, args.steps, out, f"{recipe}-{variant}-{r}")
                trials[variant].append(t)
                print(f"  [{recipe}] round {r + 1}: {variant} {t['rate']:.1f} {t['unit']}", flush=True)
        naive = statistics.median(t["rate"] for t in trials["naive"])
        fast = statistics.median(t["rate"] for t in trials["fast"])
        results[recipe] = {"naive": naive, "fast": fast, "speedup": fast / naive,
                           "unit": trials["fast"][0]["unit"], "trials": trials}
        print(f"{recipe}: naive {naive:.1f} -> fast {fast:.1f} {results[recipe]['unit']}: "
              f"{fast / naive:.2f}x")
    label = ", ".join(f"{r} {v['speedup']:.2f}x" for r, v in results.items())
    write_result("recipes", results, headline={
        "label": f"naive -> fast config speedup ({args.steps} steps, median of {args.rounds})",
        "value": label, "goal": "measured, reported as is", "passed": None})


if __name__ == "__main__":
    main()
