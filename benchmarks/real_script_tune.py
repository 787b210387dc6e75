"""The script tuner on real open-source training scripts, as their users would run it: tune the
unchanged script, apply best.patch with `git apply` and pass the winning flags, then time the
patched script against the original side by side.

    python benchmarks/real_script_tune.py --repo makemore=/path/to/makemore [--budget 10m] [--rounds 4]

    python benchmarks/real_script_tune.py --repo makemore_big=/path/to/makemore --budget 10m --rounds 0

    python benchmarks/real_script_tune.py --repo chargpt=/path/to/minGPT --budget 10m

    python benchmarks/real_script_tune.py --repo nanogpt=/path/to/nanoGPT --repo wordlm=/path/to/examples \
        --budget 10m --rounds 0

Every command in SCRIPTS is sized through the script's own flags so that its steps take 0.5 s
or more on a 2-core CPU. For scripts that slow, what the tune does with its budget is the
figure (settings measured, left unmeasured for the budget, the budget's unused share, the
baseline's step time, the other processes' load during the trials, the verification);
`--rounds 0` records it without the side-by-side runs, which take longer than the tune.
(pytorch/examples' dcgan and imagenet need torchvision, which the CPU torch here cannot load.)

The repositories are not vendored: bring them yourself (`git clone
https://github.com/karpathy/makemore`, `git clone https://github.com/karpathy/minGPT`); SCRIPTS
below holds each one's command, written with its own flags only, and where it runs. chargpt
(minGPT's projects/chargpt/chargpt.py) runs in that folder, reads input.txt from it (written
here when missing: 1 MB of the Python standard library's source, as the gpt recipe trains on)
and imports `mingpt` from the repository root (put on PYTHONPATH, as the README's `pip install
-e .` would). For each:
1. the repository is copied twice (plain, patched); `trainspeed tune --budget B --out OUT --
   CMD` runs in the plain copy, exactly what a user types;
2. `git apply OUT/best.patch` in the patched copy (the check fails the benchmark if the patch
   does not apply), and the tuned command is tune.json's `tuned_command` (the flags that won);
3. rounds of A, B and A' in rotating order: A = the original script and command, B = the
   patched copy and the tuned command, A' = the original again (A/A' is the machine's noise
   floor, reported beside the figure), both under `trainspeed run --doctor --steps N` with an empty plan
   (the same light instrumentation; B's speed comes from the code change, not from patching at
   run time). The figure is the ratio of the median steady-state step times (warm-up and
   compile steps excluded), and each side's whole-process wall time, start-up and compilation
   included, is recorded next to it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from script_tune import measured_steps, trainspeed  # noqa: E402

from trainspeed.tune.session import parse_budget  # noqa: E402

SCRIPTS = {
    # name: command run in the repository's root, with {out} for a scratch folder; or a dict
    # with the command, the folder it runs in (`cwd`, relative to the root), whether the root
    # goes on PYTHONPATH, whether an input.txt is written there when missing, a preparing
    # command and a corpus to cut. Every command sets sizes through the script's own flags so
    # that a step takes 0.5 s or more on a 2-core CPU (SLOW_STEP_S).
    # karpathy/makemore at 988aa59: its defaults (a transformer of 25 ms steps), and at n_embd
    # 384, batch 128 (steps of 0.62 s on a quiet 2-core VM; n_embd 192, batch 64 ran 0.11 s steps)
    "makemore": ["python", "makemore.py", "-i", "names.txt", "-o", "{out}", "--max-steps", "100000"],
    "makemore_big": ["python", "makemore.py", "-i", "names.txt", "-o", "{out}", "--max-steps", "100000",
                     "--type", "transformer", "--n-layer", "4", "--n-embd", "384", "--batch-size", "128"],
    # karpathy/minGPT at 37baab7: projects/chargpt at gpt-micro, batch 32, block 64
    "chargpt": {"cwd": "projects/chargpt", "pythonpath": True, "input_txt": True,
                "command": ["python", "chargpt.py", "--trainer.max_iters=100000", "--model.model_type=gpt-micro",
                            "--trainer.batch_size=32", "--data.block_size=64"]},
    # karpathy/nanoGPT at 3adf61e: the shakespeare_char config at a size whose steps take 0.76 s
    # on a 2-core CPU; its prepare.py reads input.txt (written here: no download) into train.bin
    "nanogpt": {"input_txt": "data/shakespeare_char", "prepare": ["python", "data/shakespeare_char/prepare.py"],
                "command": ["python", "train.py", "config/train_shakespeare_char.py", "--device=cpu",
                            "--compile=False", "--eval_iters=2", "--eval_interval=100000", "--log_interval=1",
                            "--block_size=256", "--batch_size=32", "--n_layer=4", "--n_head=4", "--n_embd=192",
                            "--max_iters=100000", "--lr_decay_iters=100000", "--dropout=0.0"]},
    # pytorch/examples at 77f55b9: word_language_model/main.py, a 2-layer LSTM of 256, batch 80 (0.59 s steps quiet), with
    # AdamW (its --use-optimizer), on data/small: lines of the repository's wikitext-2 test.txt
    # cut into train/valid/test in the script's layout (the train blob is 10 MB; no download)
    "wordlm": {"cwd": "word_language_model",
               "corpus": ("data/wikitext-2/test.txt", "data/small", {"train": (0, 1500), "valid": (1500, 1800),
                                                                    "test": (1800, 2100)}),
               "command": ["python", "main.py", "--data", "./data/small", "--epochs", "40", "--emsize", "256",
                           "--nhid", "256", "--batch_size", "80", "--use-optimizer", "--lr", "0.002", "--log-interval", "20",
                           "--save", "{out}/model.pt"]},
    # pytorch/examples at 77f55b9: gat/main.py, a graph attention network trained full-batch
    # (dense attention over all node pairs); its ./cora in the Cora layout, generated here
    # (write_cora: the script would download it), 2000 nodes, so a step takes 0.5 s or more
    "gat": {"cwd": "gat", "cora": True,
            "command": ["python", "main.py", "--epochs", "100000", "--num-heads", "4", "--hidden-dim", "64"]},
}

SLOW_STEP_S = 0.5
MEASURED_AT_LEAST = 3
TEN_MINUTES = 600.0
"""A 10-minute tune of a script whose steps take SLOW_STEP_S or more measures at least this
many settings (issue 33: three of four such tunes at 5-6 minutes ran only their baseline)."""


def budget_figures(tune: dict, budget_s: float, tune_s: float) -> dict:
    """How the tune spent its budget: settings measured (a speedup figure) and left unmeasured,
    the first baseline's step time, and the budget's unused share."""
    rows = tune.get("ablation", [])
    measured = [r for r in rows if r.get("speedup") is not None and math.isfinite(r["speedup"])]  # NaN: no figure
    return {"settings_measured": len(measured), "settings_unmeasured_for_budget":
            sum(1 for r in rows if r.get("speedup") is None and "budget" in str(r.get("note") or "")),
            "budget_s": budget_s, "tune_s": tune_s, "unused_share": max(0.0, 1 - tune_s / budget_s),
            "verified": (tune.get("final") or {}).get("verdict")}


def trial_figures(tune_dir: Path) -> dict:
    """From the tune's trials (tune.jsonl): the baseline's median measured step time and the
    other processes' load (cores; each trial's median) over all trials."""
    base, loads = [], []
    path = tune_dir / "tune.jsonl"
    for line in (path.read_text().splitlines() if path.is_file() else []):
        rec = json.loads(line)
        if rec.get("others_load") is not None:
            loads.append(float(rec["others_load"]))
        if rec.get("ok") and rec.get("label") == "baseline":
            base += [float(t) for t in rec.get("step_times") or [] if t]
    return {"baseline_step_s": statistics.median(base) if base else None,
            "baseline_step_s_range": [min(base), max(base)] if base else None,
            "others_load_cores": {"median": statistics.median(loads), "max": max(loads)} if loads else None,
            "trials": sum(1 for _ in path.open()) if path.is_file() else 0}


def trainspeed_commit() -> str | None:
    """The commit of the trainspeed that ran the tune ('+' when src/ had changes not committed)."""
    root = Path(__file__).resolve().parent.parent
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    if head.returncode:
        return None
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "src"], cwd=root).returncode
    return head.stdout.strip() + ("+" if dirty else "")


def cut_corpus(folder: Path, source: str, dest: str, splits: dict[str, tuple[int, int]]) -> None:
    """A small corpus in the script's own layout: line ranges of one of the repository's files."""
    lines = (folder / source).read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / dest).mkdir(parents=True, exist_ok=True)
    for split, (a, b) in splits.items():
        (folder / dest / f"{split}.txt").write_text("".join(lines[a:b]), encoding="utf-8")


def write_cora(folder: Path, nodes: int = 2000, features: int = 300, classes: int = 7, edges: int = 5000,
               seed: int = 0) -> None:
    """gat's ./cora/cora.content (id, binary features, label per line) and cora.cites (id
    pairs), random with a fixed seed, in the layout of the dataset the script downloads."""
    import random

    rng = random.Random(seed)
    ids = rng.sample(range(1, 10 * nodes), nodes)
    (folder / "cora").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in ids:
        bits = ["1" if rng.random() < 0.02 else "0" for _ in range(features)]
        bits[rng.randrange(features)] = "1"  # no all-zero row
        lines.append("\t".join([str(i), *bits, f"class_{rng.randrange(classes)}"]))
    (folder / "cora" / "cora.content").write_text("\n".join(lines) + "\n")
    pairs = {(rng.choice(ids), rng.choice(ids)) for _ in range(edges)}
    (folder / "cora" / "cora.cites").write_text("".join(f"{a}\t{b}\n" for a, b in sorted(pairs) if a != b))


def script_spec(name: str) -> dict:
    spec = SCRIPTS[name]
    return {"command": spec, "cwd": "."} if isinstance(spec, list) else {"cwd": ".", **spec}


def write_input_txt(folder: Path, size: int = 1_000_000) -> None:
    """chargpt's input.txt when the copy has none: the standard library's source text."""
    path = folder / "input.txt"
    if path.exists():
        return
    import sysconfig

    parts, total = [], 0
    for src in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = src.read_text(errors="ignore")
        parts.append(text)
        total += len(text)
        if total >= size:
            break
    path.write_text("".join(parts)[:size])


def copy_repo(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".git", "out", "__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)  # `git apply` as the user runs it


def side_by_side(arms: dict[str, tuple[Path, list[str]]], out: Path, rounds: int, steps: int,
                 warmup: int) -> dict:
    empty = out / "empty.yaml"
    empty.write_text("schema: 1\nkind: script-settings\nsettings: {}\n")
    pooled: dict[str, list[float]] = {a: [] for a in arms}
    medians: dict[str, list[float]] = {a: [] for a in arms}
    walls: dict[str, list[float]] = {a: [] for a in arms}
    names = list(arms)
    for r in range(rounds):
        for arm in names[r % len(names):] + names[:r % len(names)]:  # each arm first once per 3 rounds
            cwd, command = arms[arm]
            run_dir = out / f"side-{arm}-{r}"
            t0 = time.perf_counter()
            trainspeed("run", "--with", str(empty), "--doctor", "--quiet", "--steps", str(steps),
                       "--warmup-steps", str(warmup), "--out", str(run_dir), "--", *command, cwd=cwd)
            walls[arm].append(time.perf_counter() - t0)
            times = measured_steps(run_dir)
            pooled[arm] += times
            medians[arm].append(statistics.median(times))
    a, b, again = names
    return {
        "speedup": statistics.median(pooled[a]) / statistics.median(pooled[b]),
        "speedup_by_round": [x / y for x, y in zip(medians[a], medians[b])],
        "aa_floor": statistics.median(pooled[a]) / statistics.median(pooled[again]),
        "aa_by_round": [x / y for x, y in zip(medians[a], medians[again])],
        "median_step_ms": {k: 1e3 * statistics.median(v) for k, v in pooled.items()},
        "wall_s": walls,
        "steps_per_side_per_round": steps - warmup,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", action="append", required=True, help="NAME=PATH of a repository in SCRIPTS")
    ap.add_argument("--budget", default="10m")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300, help="steps per side-by-side run (warm-up included)")
    ap.add_argument("--warmup", type=int, default=20, help="steps excluded (compilation happens here)")
    ap.add_argument("--knobs", default=None, help="the tune's --knobs (default: all)")
    ap.add_argument("--out", default=None, help="scratch folder (default: a temporary one)")
    args = ap.parse_args()
    results = {}
    for spec in args.repo:
        name, _, path = spec.partition("=")
        if name not in SCRIPTS or not Path(path).is_dir():
            raise SystemExit(f"--repo {spec}: expected NAME=PATH with NAME in {sorted(SCRIPTS)} and PATH a folder")
        work = Path(args.out or tempfile.mkdtemp(prefix="real-tune-")) / name
        if work.exists():
            shutil.rmtree(work)
        spec = script_spec(name)
        copy_repo(Path(path), work / "plain")
        copy_repo(Path(path), work / "patched")
        plain, patched = work / "plain" / spec["cwd"], work / "patched" / spec["cwd"]
        for folder in (plain, patched):
            if spec.get("input_txt"):
                write_input_txt(folder if spec["input_txt"] is True else folder / spec["input_txt"])
            if spec.get("cora"):
                write_cora(folder)
            if spec.get("corpus"):
                cut_corpus(folder, *spec["corpus"])
            if spec.get("prepare"):
                subprocess.run([sys.executable if a == "python" else a for a in spec["prepare"]], cwd=folder,
                               check=True, capture_output=True)
        if spec.get("pythonpath"):  # both copies hold the same library code; only the script is patched
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(work / "plain"),
                                                                      os.environ.get("PYTHONPATH")]))
        command = [part.replace("{out}", str(work / "scratch")) for part in spec["command"]]
        (work / "scratch").mkdir(parents=True, exist_ok=True)
        tune_dir = work / "tune"
        t0 = time.perf_counter()
        knobs = ["--knobs", args.knobs] if args.knobs else []
        # exit 3: the budget measured nothing (a figure here, not a failure of the benchmark)
        proc = trainspeed("tune", "--budget", args.budget, *knobs, "--out", str(tune_dir), "--", *command,
                          cwd=plain, check=False)
        tune_s = time.perf_counter() - t0
        (work / "tune.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode not in (0, 3):
            raise SystemExit(f"{name}: the tune failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        tune = json.loads((tune_dir / "tune.json").read_text())
        figures = {**budget_figures(tune, parse_budget(args.budget), tune_s), **trial_figures(tune_dir)}
        print(f"{name}: {figures['settings_measured']} settings measured, "
              f"{figures['settings_unmeasured_for_budget']} left for the budget; the tune took {tune_s:.0f} s "
              f"of {figures['budget_s']:.0f} s; verification: {figures['verified']}; baseline steps "
              f"{figures['baseline_step_s']}; others' load {figures['others_load_cores']}", flush=True)
        tuned = list(tune.get("tuned_command") or command)
        patch = tune_dir / "best.patch"
        diff = patch.read_text() if patch.is_file() else ""
        if diff:
            subprocess.run(["git", "apply", "--check", str(patch)], cwd=patched, check=True)
            subprocess.run(["git", "apply", str(patch)], cwd=patched, check=True)
        entry = {
            "command": f"python benchmarks/real_script_tune.py --repo {name}=PATH --budget {args.budget} "
                       f"--rounds {args.rounds} --steps {args.steps} --warmup {args.warmup}"
                       + (f" --knobs {args.knobs}" if args.knobs else ""),
            "script_command": command, "tuned_command": tuned, "best_settings": tune.get("best_settings"),
            "best_patch": diff, "tune_s": tune_s, "verified_in_tune": tune.get("final"),
            "ablation": [{k: r.get(k) for k in ("knob", "setting", "verdict", "speedup", "ci", "note")}
                         for r in tune.get("ablation", [])],
            "code_change_md": (tune_dir / "code_change.md").read_text() if (tune_dir / "code_change.md").is_file() else None,
            "trainspeed_commit": trainspeed_commit(),
            **figures,
        }
        results[name] = entry
        if args.rounds <= 0:  # the tune's budget figures only (machine time is short)
            continue
        entry.update(side_by_side({"original": (plain, command), "patched": (patched, tuned),
                                   "original-again": (plain, command)}, work, args.rounds, args.steps, args.warmup))
        print(f"{name}: best {entry['best_settings'] or '(plain)'}; patched + flags vs original, side by side "
              f"{entry['speedup']:.2f}x (rounds {', '.join(f'{x:.2f}' for x in entry['speedup_by_round'])}); "
              f"A/A floor {entry['aa_floor']:.2f}x", flush=True)
    merged = harness.with_previous("real_script_tune", results)
    path = harness.write_result("real_script_tune", merged, headline=headline_of(merged),
                                command=harness.entry_commands(merged))
    print(table_of(merged))
    print(f"wrote {path}")
    return 0


def headline_of(merged: dict) -> dict:
    """The README's row: settings each 10-minute tune of a slow-step script measured (the goal:
    MEASURED_AT_LEAST each), and the side-by-side figures where rounds ran."""
    slow = {k: v for k, v in merged.items() if v.get("settings_measured") is not None
            and (v.get("baseline_step_s") or 0) >= SLOW_STEP_S and v.get("budget_s") == TEN_MINUTES}
    sided = {k: v for k, v in merged.items() if "speedup" in v}
    label = ("tune --budget 10m of real scripts with steps >= 0.5 s: settings measured"
             + (" (best.patch + winning flags vs the original, side by side: "
                + ", ".join(f"{k} {v['speedup']:.2f}x" for k, v in sided.items()) + ")" if sided else ""))
    return {"label": label, "value": {k: v["settings_measured"] for k, v in slow.items()},
            "goal": f">= {MEASURED_AT_LEAST} settings each on 4 scripts at least",
            "passed": sum(v["settings_measured"] >= MEASURED_AT_LEAST for v in slow.values()) >= 4,
            "baseline_step_s": {k: v.get("baseline_step_s") for k, v in slow.items()},
            "others_load_cores": {k: v.get("others_load_cores") for k, v in slow.items()},
            "speedup": {k: v["speedup"] for k, v in sided.items()},
            "aa_floor": {k: v.get("aa_floor") for k, v in sided.items()}}


def table_of(merged: dict) -> str:
    """Per script: the tune's budget figures, step time and the machine's load (markdown)."""
    rows = ["| script | budget | tune s | baseline step s | others' load (cores, median/max) | settings measured "
            "| left for the budget | verification | side by side |", "|---|---|---|---|---|---|---|---|---|"]
    for k, v in merged.items():
        if "settings_measured" not in v:
            continue
        load = v.get("others_load_cores") or {}
        step = v.get("baseline_step_s")
        side = f"{v['speedup']:.2f}x (A/A {v['aa_floor']:.2f}x)" if "speedup" in v else "-"
        rows.append(f"| {k} | {v['budget_s']:.0f} s | {v['tune_s']:.0f} | {f'{step:.2f}' if step else '-'} | "
                    f"{load.get('median', 0):.1f} / {load.get('max', 0):.1f} | {v['settings_measured']} | "
                    f"{v['settings_unmeasured_for_budget']} | {v['verified'] or '-'} | "
                    f"{side} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
