"""Tune: `trainspeed tune RECIPE --variant naive`, then its best.yaml vs the naive config.

For each recipe: the tuner runs (resumable: its --out lives under runs/bench-tune/<recipe>),
then the tuned config and the naive config are trained side by side, alternated (ABAB...)
in fresh subprocesses; the figure is each run's steady-state samples/s from report.json
(warm-up excluded). Speedup = median(tuned) / median(naive). Goals on CPU: seqvae >= 2x,
convnext >= 1.5x (gpt is reported without a goal).

    python benchmarks/tune.py [--recipes gpt,convnext,seqvae] [--budget 15m] [--rounds 3] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import entry_commands, with_previous, write_result  # noqa: E402

GOALS = {"seqvae": 2.0, "convnext": 1.5}
ROOT = Path(__file__).resolve().parent.parent


def train(target: str, extra: list[str], steps: int, out: Path, name: str) -> dict:
    cmd = [sys.executable, "-m", "trainspeed", "train", target, *extra, "--no-report",
           f"run.max_steps={steps}", "run.max_epochs=null", f"run.out_dir={out}", f"run.name={name}",
           "logging.progress=false", "eval.at_end=false", "checkpoint.save_final=false"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((out / name / "report.json").read_text())["summary"]
    return {"samples_per_s": summary["samples_per_s"], "tokens_per_s": summary.get("tokens_per_s"),
            "step_p50_s": summary["step_time"]["p50"], "loss_last": (summary.get("loss") or {}).get("last")}


def tune(recipe: str, budget: str, knobs: str | None, out: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "trainspeed", "tune", recipe, "--variant", "naive",
           "--budget", budget, "--out", str(out), *extra]
    if knobs:
        cmd += ["--knobs", knobs]
    print(f"[{recipe}] {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, check=True)
    return json.loads((out / "tune.json").read_text())


def _label(recipe: str, res: dict) -> str:
    """A recipe's headline figure. When the tuner kept the naive settings (no switch beat the
    noise), the side-by-side runs the same config twice: its ratio is noise, not a result."""
    if res["best_settings"]:
        return f"{recipe} {res['speedup']:.2f}x"
    mfu = res.get("baseline_mfu")
    at = f", naive at {100 * mfu:.0f} % MFU" if mfu else ""
    return f"{recipe} = naive (no switch beyond noise{at}; A/A {res['speedup']:.2f}x)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", default="gpt,convnext,seqvae")
    ap.add_argument("--budget", default="15m")
    ap.add_argument("--knobs", default=None,
                    help="knobs for every recipe, or per recipe: 'gpt=precision,log_every;seqvae=bucketing'")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--tune-args", default="", help="extra `trainspeed tune` options, e.g. '--steps 15'")
    ap.add_argument("--out-root", default=str(ROOT / "runs" / "bench-tune"),
                    help="tune output parent; a rerun with the same one resumes every tune")
    args = ap.parse_args()
    if args.knobs and "=" in args.knobs:
        args.knobs = dict(part.split("=", 1) for part in args.knobs.split(";"))
    scratch = Path(tempfile.mkdtemp(prefix="ts-tune-bench-"))
    results: dict[str, dict] = {}
    for recipe in args.recipes.split(","):
        out = Path(args.out_root) / recipe
        knobs = args.knobs.get(recipe) if isinstance(args.knobs, dict) else args.knobs
        tuned = tune(recipe, args.budget, knobs, out, shlex.split(args.tune_args))
        sides = {"naive": (recipe, ["--variant=naive"]), "tuned": (str(out / "best.yaml"), [])}
        runs: dict[str, list[dict]] = {"naive": [], "tuned": []}
        for r in range(args.rounds):
            for side in (("naive", "tuned") if r % 2 == 0 else ("tuned", "naive")):
                target, extra = sides[side]
                t = train(target, extra, args.steps, scratch, f"{recipe}-{side}-{r}")
                runs[side].append(t)
                print(f"  [{recipe}] round {r + 1}: {side} {t['samples_per_s']:.2f} samples/s", flush=True)
        naive = statistics.median(t["samples_per_s"] for t in runs["naive"])
        best = statistics.median(t["samples_per_s"] for t in runs["tuned"])
        results[recipe] = {"naive_samples_per_s": naive, "tuned_samples_per_s": best,
                           "speedup": best / naive, "goal": GOALS.get(recipe),
                           "best_settings": tuned["best_settings"],
                           "baseline_mfu": tuned.get("baseline_mfu"), "peak_name": tuned.get("peak_name"),
                           "tune_notes": tuned.get("notes") or [],
                           "tune_final": tuned["final"], "runs": runs,
                           "ablation": [{k: r[k] for k in ("knob", "setting", "speedup", "verdict",
                                                           "memory_ratio", "loss_delta", "note")}
                                        for r in tuned["ablation"]]}
        print(f"{recipe}: naive {naive:.2f} -> tuned {best:.2f} samples/s: {best / naive:.2f}x "
              f"(best: {tuned['best_settings']})")
    # Tuning a subset of recipes keeps the other recipes' earlier entries (each with its command).
    for recipe in results:
        results[recipe]["command"] = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    results = with_previous("tune", results)
    goals = [(r, v) for r, v in results.items() if v["goal"]]
    passed = all(v["speedup"] >= v["goal"] for _, v in goals) if goals else None
    label = ", ".join(_label(r, v) for r, v in results.items())
    goal = ", ".join(f"{r} >= {v['goal']}x" for r, v in goals) or "-"
    # The file holds recipes tuned by different commands: name each one.
    write_result("tune", results, command=entry_commands(results),
                 headline={"label": "tuned vs naive (trainspeed tune)", "value": label,
                           "goal": goal, "passed": passed})


if __name__ == "__main__":
    main()
