"""Does the doctor name the planted cause, on a quiet machine and on a busy one?

    python benchmarks/doctor_truth.py [--only NAME[,NAME...]] [--quick] [--threads 1]

Each script in tests/assets/scripts/ has one planted problem (or none: healthy.py) and declares
the finding id(s) that name it; loops of several kinds (a GAN's two optimizers, actor-critic, a
no-grad teacher with an EMA copy, an LBFGS closure, a manual update, per-sample nn.Module
transforms) also name findings that must not appear (a GAN read as gradient accumulation). Four
real open-source scripts (doctor_truth_real.py) run unchanged at a pinned commit on generated
data; their true cause is measured first (their knob, A/B alternated), not read from the doctor. Each runs twice through the real CLI in a subprocess,
`trainspeed doctor --steps N --out DIR -- python SCRIPT ARGS`:

  quiet    as the machine is (other tenants included: this is a shared VM);
  loaded   the same, and halfway through the run (when steps.jsonl holds N/2 step records)
           the benchmark starts CPU burners, one busy-loop process per core, in their own
           session (not children of the doctor's process, as another tenant's jobs are not),
           killed when the run ends.

From DIR/report.json it records the top finding about the script (id, severity, title: the
first one other than machine_contention, which says "not the script" with 0 % at stake, and
ranks above an info finding when it is a warning), every warning-or-worse finding id, whether
the top finding names the planted cause (its id is one the script expects, at warning level or
worse, or at info level for host syncs in a CPU run, which cost nothing there; for healthy.py:
no warning-level finding about the script), and whether machine_contention appeared. Goal: right in both conditions for every script, and no warning on healthy.py.

The scripts run with OMP_NUM_THREADS=1 (--threads): they are sized for one thread, as in the
test suite; two OpenMP threads on a shared 2-core machine spin against the other tenants and
make a step up to 10x slower, from one second to the next, whatever the script does.
--quick runs a third of the steps and writes no results file; --only measures some scripts and
merges them into this machine's results file.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import doctor_truth_real as real_scripts  # noqa: E402
import harness  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "assets" / "scripts"
MIRROR = Path("/work/.mirror")
"""Where the real scripts' repositories are (OWNER+NAME/repo git directories; --mirror)."""
WARN = ("warning", "critical")
CONTENTION = "machine_contention"
NOT_THE_SCRIPT = (CONTENTION, "machine_busy")
"""Findings about the machine, not the script (0 % at stake): the script is judged without them."""


@dataclass(frozen=True)
class Case:
    script: str
    """File in tests/assets/scripts/."""
    expect: tuple[str, ...]
    """Finding ids that name the planted cause; () for a healthy script (no warning expected)."""
    steps: int
    """Doctor steps: a multiple of 40, so that N/2 falls on a 20-step flush of steps.jsonl."""
    args: tuple[str, ...] = ()
    """Script arguments; {tmp} is a scratch directory of the run."""
    planted: str = ""
    min_severity: str = "warning"
    """The top finding must be at least this severe ("info" for host syncs in a CPU run, which
    cost nothing there: the doctor names them with a GPU estimate)."""
    needs: str | None = None
    """A module the script imports (skipped without it)."""
    forbid: tuple[str, ...] = ()
    """Finding ids that must not appear at all, at any severity (a GAN's two updates read as
    gradient accumulation, a no-grad teacher read as evaluation)."""
    real: str | None = None
    """A real open-source script (doctor_truth_real.REAL): `script` names it, its expectation
    is settled by measuring its knob (measure_truth) before the doctor runs judge it."""


CASES: dict[str, Case] = {c.script.removesuffix(".py"): c for c in (
    # steps: ~10 s of stepping on a quiet 2-core VM at one thread (the system sampler reads the
    # machine once a second: ~5 readings before the load and ~5 under it). --steps/--epochs of
    # the scripts are set far beyond them: the doctor's --steps ends every run.
    Case("data_bound.py", ("data_bound",), 360, ("--steps", "100000"),
         planted="per-sample augmentation in __getitem__, num_workers=0"),
    Case("padding.py", ("padding_waste",), 720, ("--steps", "100000"),
         planted="every batch padded to 256 tokens (8-40 real)"),
    Case("save_every_step.py", ("checkpointing",), 480, ("--steps", "100000", "--ckpt-dir", "{tmp}/ckpt"),
         planted="torch.save of model + optimizer (4.6 MiB) every step"),
    Case("eval_every_step.py", ("evaluation_share",), 1200, ("--steps", "100000"),
         planted="a full validation pass (4 batches) after every step"),
    Case("cache_gc.py", ("cache_gc_in_loop",), 80, ("--steps", "100000"),
         planted="gc.collect() + torch.cuda.empty_cache() every step"),
    Case("item_every_step.py", ("host_syncs",), 4000, ("--steps", "1000000"), min_severity="info",
         planted="loss.item() every step (costs nothing on a CPU: named at info level)"),
    Case("growing_log.py", ("step_time_growth",), 400, ("--steps", "100000", "--logdir", "{tmp}/tb"),
         planted="mean over an ever-growing history, logged to TensorBoard every step"),
    Case("healthy.py", (), 640, ("--steps", "100000"),
         planted="none: batch gather, compute-bound, loss read every 100 steps"),
    Case("lightning_script.py", ("data_bound",), 520, ("--steps", "100000"), needs="lightning",
         planted="Lightning; per-sample augmentation, num_workers=0"),
    Case("lightning_val_loader.py", ("data_bound",), 320, ("--steps", "100000"), needs="lightning",
         planted="Lightning; slow __getitem__, num_workers=0, validation every 20 steps"),
    Case("word_lm_manual_sgd.py", ("host_syncs",), 1280, ("--epochs", "100000"), min_severity="info",
         planted="manual SGD (no torch.optim), sequence-first LSTM LM; loss.item() every step"),
    Case("nanogpt_style.py", ("data_bound",), 640, ("--batch_size=32", "--eval_interval=100000"),
         planted="nanoGPT get_batch: memmap slices, from_numpy, stack per sample, no DataLoader"),
    # loops of several kinds (issue 32): several optimizers and models, closures, manual updates
    Case("gan_two_optimizers.py", (), 240, ("--steps", "100000"), forbid=("accumulation_for_speed",),
         planted="none: a GAN, optimizerD after two backwards, optimizerG after one (not accumulation)"),
    Case("actor_critic.py", ("evaluation_share",), 240, ("--steps", "100000"), forbid=("accumulation_for_speed",),
         planted="16 no-grad rollouts in eval() after every update; one optimizer, two models, two losses"),
    Case("teacher_ema.py", (), 320, ("--steps", "100000"), forbid=("evaluation_share",),
         planted="none: a no-grad teacher inside the step, an EMA copy of the student"),
    Case("lbfgs_closure.py", ("data_bound",), 160, ("--steps", "100000"), forbid=("accumulation_for_speed",),
         planted="LBFGS closure (4 evaluations per step); per-sample Python __getitem__, num_workers=0"),
    Case("manual_sgd_ckpt.py", ("checkpointing",), 200, ("--steps", "100000", "--ckpt-dir", "{tmp}/ckpt"),
         planted="manual update without torch.optim; torch.save of the model every step"),
    Case("module_transforms.py", ("data_bound",), 160, ("--steps", "100000"),
         planted="per-sample nn.Module transforms in the dataset (torchvision v2 style), num_workers=0"),
    # real open-source scripts at a pinned commit, unchanged; expectations measured (doctor_truth_real)
    Case("real_word_language_model", (), 160, real="real_word_language_model",
         planted="pytorch/examples word_language_model/main.py (LSTM, manual SGD, loss.item() per step)"),
    Case("real_makemore", (), 200, real="real_makemore",
         planted="karpathy/makemore makemore.py (transformer, 4 DataLoader workers by default)"),
    Case("real_nanogpt", (), 160, real="real_nanogpt",
         planted="karpathy/nanoGPT train.py (memmap get_batch, 2 micro-batches, --compile=False)"),
    Case("real_mingpt_chargpt", (), 160, real="real_mingpt_chargpt",
         planted="karpathy/minGPT projects/chargpt (gpt-nano, 4 DataLoader workers by default)"),
)}


# --- the background load ---------------------------------------------------------------------

BURN = "import time\nstop = time.time() + float(__import__('sys').argv[1])\nwhile time.time() < stop:\n    pass\n"


def start_burners(count: int, seconds: float) -> list[subprocess.Popen]:
    """`count` busy-loop processes in sessions of their own, each ending by itself after
    `seconds` at the latest (killed earlier by stop_burners)."""
    return [subprocess.Popen([sys.executable, "-c", BURN, str(seconds)], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(count)]


def stop_burners(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
        p.wait()


def prune_checkpoints(folder: Path, proc: subprocess.Popen, keep: int = 4) -> None:
    """Delete all but the newest `keep` files of `folder` while `proc` runs: save_every_step
    writes a new 4.6 MiB file per step (gigabytes over a run on a shared disk)."""
    while proc.poll() is None:
        try:
            files = sorted(folder.iterdir(), key=lambda f: f.stat().st_mtime)
            for f in files[:-keep]:
                f.unlink(missing_ok=True)
        except OSError:
            pass  # a file went away between listing and stat: the next round gets it
        time.sleep(0.5)


def others_cores(run_dir: Path) -> float | None:
    """Median CPU of other processes during the run, in cores (the system sampler's series):
    on a shared machine the quiet condition is never idle."""
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        event = json.loads(line)
        series = (event.get("data") or {}).get("series") if event.get("type") == "system" else None
        if isinstance(series, dict):
            values = sorted(v for v in series.get("cpu_others") or [] if isinstance(v, (int, float)))
            return round(values[len(values) // 2] / 100, 2) if values else None
    return None


def step_records(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


# --- one doctor run --------------------------------------------------------------------------

def command_of(case: Case, tmp: Path, mirror: Path) -> tuple[list[str], dict[str, str]]:
    """`python SCRIPT ARGS` of a case in its scratch directory, and the environment it needs (a
    real script's files and data are laid out there first)."""
    if case.real:
        script, args, path = real_scripts.prepare(real_scripts.REAL[case.real], tmp, mirror)
        return ["python", str(script), *args], {"PYTHONPATH": os.pathsep.join(
            [path, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return ["python", str(SCRIPTS / case.script), *[a.replace("{tmp}", str(tmp)) for a in case.args]], {}


def run_case(case: Case, condition: str, steps: int, work: Path, threads: int, mirror: Path = MIRROR,
             extra: tuple[str, ...] = (), timeout: int = 600) -> dict:
    out = work / f"{case.script.removesuffix('.py')}-{condition}"
    tmp = work / f"{case.script.removesuffix('.py')}-{condition}-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    command, env_extra = command_of(case, tmp, mirror)
    cmd = [sys.executable, "-m", "trainspeed", "doctor", "--steps", str(steps), "--out", str(out), "--no-html",
           "--", *command, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), **env_extra}
    t0 = time.perf_counter()
    # cwd: the scratch directory (nanogpt_style writes its .bin files and printed losses there)
    proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if "{tmp}/ckpt" in case.args or case.real:  # a real script's checkpoints too
        threading.Thread(target=prune_checkpoints, args=(tmp / "ckpt", proc), daemon=True).start()
    burners: list[subprocess.Popen] = []
    load_at = None
    try:
        if condition == "loaded":
            half = steps // 2
            while proc.poll() is None and step_records(out / "steps.jsonl") < half:
                time.sleep(0.02)
            if proc.poll() is None:
                load_at = step_records(out / "steps.jsonl")
                burners = start_burners(os.cpu_count() or 2, seconds=600)
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        log, _ = proc.communicate()
        return {"error": f"timed out after {timeout} s", "log_tail": (log or "")[-2000:],
                "wall_s": round(time.perf_counter() - t0, 1)}
    finally:
        stop_burners(burners)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.perf_counter() - t0
    report_path = out / "report.json"
    if proc.returncode != 0 or not report_path.exists():
        return {"error": f"exit {proc.returncode}", "log_tail": (log or "")[-2000:], "wall_s": round(wall, 1)}
    report = json.loads(report_path.read_text())
    findings = report.get("findings") or []
    # machine_contention says "not the script" and has 0 % at stake; at warning level it ranks
    # above an info finding (a CPU run's host syncs), so the script is judged by the first
    # finding about it; the report's own first finding is recorded too
    about = [f for f in findings if f["id"] not in NOT_THE_SCRIPT]
    top = about[0] if about else None
    warnings = [f["id"] for f in findings if f.get("severity") in WARN]
    about_script = [i for i in warnings if i not in NOT_THE_SCRIPT]
    expect = tuple(expect_override) if (expect_override := case_expect.get(case.script)) is not None else case.expect
    if expect:
        severe = WARN if case.min_severity == "warning" else (*WARN, "info")
        right = top is not None and top["id"] in expect and top["severity"] in severe
    else:
        right = not about_script
    forbidden = [f["id"] for f in findings if f["id"] in case.forbid]
    time_goes = report.get("time_goes") or {}
    bound_expected = case_bound.get(case.script)
    right = right and not forbidden and (bound_expected is None or time_goes.get("bound") == bound_expected)
    contention = next((f for f in findings if f["id"] == CONTENTION), None)
    summary = report.get("summary") or {}
    return {
        "top": {k: top[k] for k in ("id", "severity", "title")} if top else None,
        "report_first": findings[0]["id"] if findings else None,
        "time_goes": time_goes.get("statement"),
        "bound": time_goes.get("bound"),
        "forbidden_seen": forbidden,
        "warnings": warnings,
        "right": right,
        "contention": contention is not None,
        "contention_severity": contention["severity"] if contention else None,
        "contention_evidence": contention["evidence"] if contention else None,
        "load_started_after_step": load_at,
        "others_cores_median": others_cores(out),
        "steps": summary.get("steps"),
        "median_step_ms": round(1e3 * float(summary["step_time"]["p50"]), 2)
        if isinstance(summary.get("step_time"), dict) and summary["step_time"].get("p50") else None,
        "wall_s": round(wall, 1),
    }


# --- a real script's true cause, measured ----------------------------------------------------

case_expect: dict[str, tuple[str, ...]] = {}
"""Expectations of the real scripts, as measure_truth settled them (script -> finding ids)."""
case_bound: dict[str, str | None] = {}
"""What their report's "where the time goes" must say (None: not judged)."""


def measure_truth(case: Case, work: Path, threads: int, mirror: Path, steps: int, rounds: int = 2) -> dict:
    """The script with its own settings (A) and with its knob changed (B), alternated A B A B
    under the doctor on this machine; the medians of each arm's median step time decide
    (doctor_truth_real.WIN) which expectation holds."""
    real = real_scripts.REAL[case.real or ""]
    times: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(rounds):
        for arm, extra in (("A", ()), ("B", real.knob)):
            result = run_case(case, f"truth-{arm}{r}", steps, work, threads, mirror, extra=extra)
            if result.get("median_step_ms"):
                times[arm].append(float(result["median_step_ms"]))
            print(f"{case.script:24s} truth {arm}{r} {result.get('median_step_ms')} ms "
                  f"{result.get('error') or ''}", flush=True)
    if not times["A"] or not times["B"]:
        return {"knob": real.knob_label, "error": "an arm did not run", "times_ms": times}
    a, b = statistics.median(times["A"]), statistics.median(times["B"])
    won = a / b >= real_scripts.WIN
    expect, bound = (real.if_won, real.bound_if_won) if won else (real.if_lost, real.bound_if_lost)
    case_expect[case.script], case_bound[case.script] = expect, bound
    return {"knob": real.knob_label, "knob_args": list(real.knob), "times_ms": times, "a_ms": a, "b_ms": b,
            "speedup": round(a / b, 2), "won": won, "expect": list(expect), "bound": bound,
            "source": f"{real.repo}@{real.commit[:12]}:{real.script}"}


# --- table and goal --------------------------------------------------------------------------

def cell(r: dict | None) -> str:
    if r is None:
        return "-"
    if "error" in r:
        return f"ERROR {r['error']}"
    top = f"{r['top']['id']} ({r['top']['severity']})" if r["top"] else "(no finding)"
    return f"{'ok ' if r['right'] else 'NO '} {top}"


def print_table(results: dict) -> None:
    rows = [("script", "expects", "quiet: top finding about the script", "loaded: top finding about the script",
             "contention (loaded)")]
    for name, e in results.items():
        loaded = e.get("loaded") or {}
        seen = loaded.get("contention")
        rows.append((name, ", ".join(e["expect"]) or "no warning", cell(e.get("quiet")), cell(e.get("loaded")),
                     "-" if seen is None else (f"yes ({loaded['contention_severity']})" if seen else "no")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for name, e in results.items():
        for cond in ("quiet", "loaded"):
            r = e.get(cond) or {}
            extra = [i for i in r.get("warnings", []) if not r.get("top") or i != r["top"]["id"]]
            if extra:
                print(f"  {name} {cond}: also at warning or worse: {', '.join(extra)}")


def headline(results: dict) -> dict:
    n = len(results)
    quiet = sum(bool((e.get("quiet") or {}).get("right")) for e in results.values())
    loaded = sum(bool((e.get("loaded") or {}).get("right")) for e in results.values())
    seen = sum(bool((e.get("loaded") or {}).get("contention")) for e in results.values())
    healthy = results.get("healthy")
    healthy_ok = healthy is None or all((healthy.get(c) or {}).get("right") for c in ("quiet", "loaded"))
    return {
        "label": (f"top finding names the planted cause: quiet {quiet}/{n}, with a CPU load from halfway "
                  f"{loaded}/{n}; machine_contention reported in {seen}/{n} loaded runs"),
        "value": {"quiet": quiet, "loaded": loaded, "scripts": n, "contention_seen": seen},
        "goal": ("all scripts right in both conditions (top finding names the cause, no forbidden finding, "
                 "a real script's measured bound stated); no warning-level finding on healthy.py"),
        "passed": quiet == n and loaded == n and healthy_ok,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="comma-separated script names (default: all): "
                    + ", ".join(CASES))
    ap.add_argument("--quick", action="store_true", help="a third of the steps; no results file written")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the scripts (default 1)")
    ap.add_argument("--conditions", default="quiet,loaded")
    ap.add_argument("--keep", default=None, help="keep the run directories here (default: a temp dir)")
    ap.add_argument("--mirror", default=str(MIRROR), help="folder of OWNER+NAME/repo git directories of the real "
                    "scripts' repositories (doctor_truth_real.py)")
    ap.add_argument("--truth-steps", type=int, default=40, help="doctor steps of each A/B run of a real script's knob")
    ap.add_argument("--machine-note", default="", help="recorded with the results: who else used the machine")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown script(s) {unknown}; choose from {', '.join(CASES)}")
    conditions = args.conditions.split(",")
    work_ctx = tempfile.TemporaryDirectory(prefix="doctor-truth-") if args.keep is None else None
    work = Path(work_ctx.name if work_ctx else args.keep)
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    started = time.perf_counter()
    try:
        for name in names:
            case = CASES[name]
            if case.needs:
                try:
                    __import__(case.needs)
                except ImportError:
                    print(f"{name}: skipped ({case.needs} is not installed)")
                    continue
            steps = max(40, (case.steps // 3) // 40 * 40) if args.quick else case.steps
            command = (["python", real_scripts.REAL[case.real].script, *real_scripts.REAL[case.real].args] if case.real
                       else ["python", f"tests/assets/scripts/{case.script}", *case.args])
            entry: dict = {"expect": list(case.expect), "planted": case.planted, "doctor_steps": steps,
                           "script_command": shlex.join(command), "forbid": list(case.forbid)}
            if case.real:
                entry["truth"] = measure_truth(case, work, args.threads, Path(args.mirror), args.truth_steps)
                entry["expect"] = entry["truth"].get("expect", [])
                if "error" in entry["truth"]:
                    print(f"{name}: truth not measured ({entry['truth']['error']}); skipped")
                    continue
            for cond in conditions:
                r = run_case(case, cond, steps, work, args.threads, Path(args.mirror))
                entry[cond] = r
                print(f"{name:24s} {cond:6s} {cell(r):48s} warnings {r.get('warnings')} "
                      f"contention {r.get('contention')} load after step {r.get('load_started_after_step')} "
                      f"({r.get('wall_s')} s)", flush=True)
            entry["command"] = (f"python benchmarks/doctor_truth.py --only {name}"
                                + (f" --threads {args.threads}" if args.threads != 1 else ""))
            results[name] = entry
    finally:
        if work_ctx:
            work_ctx.cleanup()
    print(f"\n{len(results)} scripts x {len(conditions)} conditions in {time.perf_counter() - started:.0f} s\n")
    print_table(results)
    head = headline(results)
    print(f"\n{head['label']}\ngoal: {head['goal']}: {'met' if head['passed'] else 'NOT met'}")
    if args.quick:
        print("(--quick: no results file written)")
        return 0
    if args.machine_note:
        for entry in results.values():
            entry["machine_note"] = args.machine_note
    merged = harness.with_previous("doctor_truth", results) if args.only else results
    command = ("python benchmarks/doctor_truth.py" if not args.only else harness.entry_commands(merged))
    harness.write_result("doctor_truth", merged, headline=headline(merged), command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
