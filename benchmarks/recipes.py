"""Recipes: naive vs fast config of each built-in recipe on this machine, measured honestly.

Each trial is `trainspeed train RECIPE [--naive]` in a fresh subprocess (clean threads,
caches, memory); naive and fast alternate (ABAB...) to cancel machine drift; the figure is
the steady-state tokens/s (samples/s when a recipe has no tokens) from each run's
report.json, warm-up excluded. Speedup = median(fast) / median(naive), whatever it is.
Tokens are real (non-pad) tokens, so padding never makes a run look fast. Evaluation is
switched off in the trials (it is not training throughput).

    python benchmarks/recipes.py [--recipes gpt,convnext,seqvae,hf] [--rounds 3] [--steps N]

Default steps per recipe keep each trial well under a minute on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import entry_commands, with_previous, write_result  # noqa: E402


DEFAULT_STEPS = {"gpt": 40, "convnext": 30, "seqvae": 12, "hf": 30}


def trial(recipe: str, variant: str, steps: int, out: Path, name: str, threads: int | None) -> dict:
    cmd = [sys.executable, "-m", "trainspeed", "train", recipe, f"--variant={variant}", "--no-report",
           f"run.max_steps={steps}", f"run.out_dir={out}", f"run.name={name}",
           "logging.progress=false", "eval.at_end=false", "eval.every_steps=null"]
    if threads:
        cmd.append(f"run.torch_threads={threads}")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((out / name / "report.json").read_text())["summary"]
    rate = summary.get("tokens_per_s") or summary.get("samples_per_s")
    return {"rate": rate, "unit": "tokens/s" if summary.get("tokens_per_s") else "samples/s",
            "step_p50_s": summary["step_time"]["p50"],
            "phases": {k: v.get("share") for k, v in summary["phases"].items()},
            "loss_last": (summary.get("loss") or {}).get("last")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", default=",".join(DEFAULT_STEPS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="steps per trial (default: per recipe)")
    ap.add_argument("--threads", type=int, default=None,
                    help="run.torch_threads for both variants (default: PyTorch's). On a CPU shared "
                         "with other jobs, intra-op threads spin-wait for busy cores and small steps "
                         "become erratic; --threads 1 keeps the comparison about the configs")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="ts-recipes-"))
    results: dict[str, dict] = {}
    for recipe in args.recipes.split(","):
        steps = args.steps or DEFAULT_STEPS.get(recipe, 40)
        trials: dict[str, list[dict]] = {"naive": [], "fast": []}
        for r in range(args.rounds):
            order = ("naive", "fast") if r % 2 == 0 else ("fast", "naive")
            for variant in order:
                t = trial(recipe, variant, steps, out, f"{recipe}-{variant}-{r}", args.threads)
                trials[variant].append(t)
                print(f"  [{recipe}] round {r + 1}: {variant} {t['rate']:.1f} {t['unit']}", flush=True)
        naive = statistics.median(t["rate"] for t in trials["naive"])
        fast = statistics.median(t["rate"] for t in trials["fast"])
        # per-round ratios: the two runs of a round are adjacent in time, so they share the
        # machine's load; their median is robust when the load drifts between rounds
        by_round = [f["rate"] / n["rate"] for n, f in zip(trials["naive"], trials["fast"])]
        results[recipe] = {"naive": naive, "fast": fast, "speedup": fast / naive, "steps": steps,
                           "speedup_of_rounds": statistics.median(by_round), "round_speedups": by_round,
                           "unit": trials["fast"][0]["unit"], "threads": args.threads or "default",
                           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "trials": trials}
        print(f"{recipe}: naive {naive:.1f} -> fast {fast:.1f} {results[recipe]['unit']}: "
              f"{fast / naive:.2f}x")
        results[recipe]["command"] = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    # Measuring a subset of recipes keeps the other recipes' earlier entries (each has its
    # date and command).
    results = with_previous("recipes", results)
    results["_conditions"] = {"torch_threads": args.threads or "default",
                              "load_average_1m_at_end": os.getloadavg()[0]}
    entries = {r: v for r, v in results.items() if not r.startswith("_")}
    label = ", ".join(f"{r} {v['speedup']:.2f}x" for r, v in entries.items())
    rounds = sorted({len(v["trials"]["naive"]) for v in entries.values() if "trials" in v} or {args.rounds})
    runs = f"{rounds[0]}" if len(rounds) == 1 else f"{rounds[0]}-{rounds[-1]}"
    write_result("recipes", results, command=entry_commands(results), headline={
        "label": f"naive -> fast config speedup (median of {runs} alternated runs each)",
        "value": label, "goal": "measured, reported as is", "passed": None})


if __name__ == "__main__":
    main()
