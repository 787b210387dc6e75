"""Faults a new user meets, tried as they would meet them, for every checkpoint kind:

- kill -9 during saves (a checkpoint every step), then the same command with --auto-resume;
- a full disk during a save (a real tmpfs, sized so that about two checkpoints fit), then
  --auto-resume on a larger disk;
- SIGTERM mid-run, then the resume command the stop line printed;
- a full disk under the doctor (a tmpfs run directory of a few KB).

Kinds: plain (torch.save), async (background write), dcp (FSDP, 2 ranks under torchrun, DCP
directories), deepspeed (ZeRO-2, one process, DS_ACCELERATOR=cpu). Each trial counts as
"intact" when the resume ran to the end from a verified checkpoint with no gap in the step
records, or (kill -9 only) with the steps whose records the kill lost named by the resume's
records_lost event, and "clean" when the failure said what happened in one line (no traceback; rc 28 for
a full disk, 143 for SIGTERM). Results go to benchmarks/results/faults-<machine>.json, written
after every trial (a long run stopped part way keeps what it measured).

A real tmpfs needs root (mount -t tmpfs); without it the disk-full trials are skipped and say
so (the tests inject ENOSPC instead: tests/engine/checkpoint/test_ckpt_space.py).

    python benchmarks/faults.py [--trials 5] [--kinds plain,async,dcp,deepspeed]
                                [--faults kill9,diskfull,sigterm,doctor]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "recipe.options.size=null", "recipe.options.n_layer=2", "recipe.options.n_head=2",
    "recipe.options.n_embd=32", "recipe.options.block_size=32", "recipe.options.samples_per_epoch=512",
    "recipe.options.val_samples=32", "recipe.options.dropout=0.0", "run.torch_threads=1",
    "logging.every=1", "logging.warmup_steps=1", "logging.progress=false", "eval.at_end=false",
]
KINDS = {
    "plain": (["checkpoint.async_save=false"], 1),
    "async": (["checkpoint.async_save=true"], 1),
    "dcp": (["distributed.strategy=fsdp", "checkpoint.async_save=true"], 2),
    "deepspeed": (["distributed.strategy=deepspeed", "distributed.zero_stage=2"], 1),
}
STEPS = 16
DOCTOR_SCRIPT = """
import sys, torch
from torch import nn
torch.manual_seed(0)
model = nn.Linear(64, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(200):
    loss = model(torch.randn(16, 64)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
sys.exit(0)
"""


def env(ws: Path) -> dict[str, str]:
    return {**os.environ, "TRAINSPEED_CACHE": str(ws / "cache"), "OMP_NUM_THREADS": "1",
            "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions"),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}


def launcher(nproc: int) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "trainspeed"]
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_port", str(port), "-m", "trainspeed"]


def train_cmd(kind: str, out: Path, name: str, *extra: str, steps: int = STEPS) -> list[str]:
    overrides, nproc = KINDS[kind]
    return [*launcher(nproc), "train", "gpt", *TINY, *overrides, f"run.out_dir={out}",
            f"run.name={name}", f"run.max_steps={steps}", "--no-report", *extra]


def run(cmd: list[str], ws: Path, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env(ws), cwd=ws, capture_output=True, text=True, timeout=timeout)


def steps_of(run_dir: Path) -> list[int]:
    path = run_dir / "steps.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            pass
    return out


def events_of(run_dir: Path, kind: str) -> list[dict]:
    path = run_dir / "events.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("type") == kind:
            rows.append(row.get("data") or {})
    return rows


def temps(run_dir: Path) -> list[str]:
    ckpt = run_dir / "checkpoints"
    return sorted(p.name for p in ckpt.iterdir() if ".tmp-" in p.name) if ckpt.is_dir() else []


def clean(stderr: str) -> bool:
    """No traceback from trainspeed's processes: no frame of trainspeed's (or the script's) code.
    torchrun's own ChildFailedError/SignalException tracebacks (the launcher reporting on its
    workers, all in torch.distributed's frames) are the launcher's, not counted."""
    frames = [ln for ln in stderr.splitlines() if ln.lstrip().startswith('File "')]
    launcher = ("torch/distributed/", "<frozen runpy>", "/subprocess.py", "/threading.py")
    return all(any(mark in f for mark in launcher) for f in frames)


def exit_says(proc_rc: int, stderr: str, code: int) -> bool:
    """The run's exit code is `code`; under torchrun (rc 1 for any failed worker) the workers'
    exit codes in its summary are, and after SIGTERM torchrun's own SignalException rc 1."""
    return proc_rc == code or (proc_rc == 1 and (f"exitcode  : {code}" in stderr or (
        code == 143 and "SignalException" in stderr)))


def resumed_intact(proc: subprocess.CompletedProcess, run_dir: Path, steps: int = STEPS) -> tuple[bool, str]:
    """The resume ran to the end from a checkpoint, and the records cover every step once."""
    if proc.returncode != 0:
        said = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()][:3]
        return False, f"resume rc {proc.returncode}: {said or proc.stderr.strip()[-400:]}"
    restart = events_of(run_dir, "restart")
    if not restart:
        return False, "no restart event"
    got = sorted(set(steps_of(run_dir)))
    if got != list(range(1, steps + 1)):
        missing = sorted(set(range(1, steps + 1)) - set(got))
        # a kill -9 after a checkpoint was published but before its steps' records were
        # written: the resume cannot fill the gap, but must name it (a records_lost event)
        named = set()
        for e in events_of(run_dir, "warning"):
            if e.get("kind") == "records_lost":
                named.update(range(e["first_step"], e["last_step"] + 1))
        if not set(missing) <= named:
            return False, f"steps missing from the records, unnamed: {sorted(set(missing) - named)}"
        return True, f"resumed at step {restart[-1].get('at_step')}; steps {missing} without records, named"
    return True, f"resumed at step {restart[-1].get('at_step') or restart[-1].get('from_step')}"


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            kids = []
        out += map(int, kids)
        todo += map(int, kids)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL the launcher and every rank: torchrun starts its workers in sessions of their
    own, so killing its process group would leave them running on."""
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(predicate, timeout: float, proc: subprocess.Popen) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def trial_kill9(kind: str, ws: Path, i: int, rng: random.Random) -> dict:
    name = f"kill9-{kind}-{i}"
    run_dir = ws / "runs" / name
    extra = ["checkpoint.every_steps=1", "checkpoint.keep_last=2"]
    steps = 120  # saves every step: the kill lands in a save (or between two) long before the end
    proc = subprocess.Popen(train_cmd(kind, ws / "runs", name, *extra, steps=steps), env=env(ws), cwd=ws,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        ckpts = run_dir / "checkpoints"
        started = wait_for(lambda: ckpts.is_dir() and any(p.name.startswith("step-") for p in ckpts.iterdir()),
                           300, proc)
        time.sleep(rng.uniform(0.0, 1.5))
        finished = proc.poll() is not None
        kill_tree(proc.pid)
    finally:
        proc.wait(timeout=60)
    if not started or finished:
        return {"trial": i, "intact": None, "clean": None, "note": "ended before the kill: no fault"}
    resume = run(train_cmd(kind, ws / "runs", name, *extra, "--auto-resume", steps=steps), ws)
    ok, note = resumed_intact(resume, run_dir, steps)
    return {"trial": i, "intact": ok, "clean": clean(resume.stderr), "note": note}


def _mount(path: Path, size: int) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True)


def checkpoint_bytes(kind: str, ws: Path) -> tuple[int, int]:
    """(one checkpoint, the run directory without checkpoints) of this kind, measured once."""
    name = f"size-{kind}"
    run_dir = ws / "runs" / name
    if not run_dir.exists():
        run(train_cmd(kind, ws / "runs", name, "checkpoint.every_steps=4", "checkpoint.keep_last=0",
                      "checkpoint.save_final=false"), ws)

    def size(p: Path) -> int:
        return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())

    ckpts = sorted(p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-")
                   and not p.name.endswith(".json"))
    one = size(ckpts[-1]) + 4096
    rest = size(run_dir) - size(run_dir / "checkpoints")
    return one, rest


def trial_diskfull(kind: str, ws: Path, i: int, rng: random.Random) -> dict:
    one, rest = checkpoint_bytes(kind, ws)
    mnt = ws / f"mnt-{kind}-{i}"
    size = rest + int(one * rng.uniform(1.6, 2.6)) + 64 * 1024
    if not _mount(mnt, size):
        return {"trial": i, "intact": None, "clean": None, "note": "no tmpfs (needs root): skipped"}
    try:
        extra = ["checkpoint.every_steps=4", "checkpoint.keep_last=0"]
        full = run(train_cmd(kind, mnt, "r", *extra), ws)
        run_dir = mnt / "r"
        said = [ln for ln in full.stderr.splitlines() if "no space left on" in ln]
        left = temps(run_dir)
        is_clean = (exit_says(full.returncode, full.stderr, 28) and len(said) >= 1 and clean(full.stderr) and not left
                    and (kind == "dcp" or "sharded" not in " ".join(said)))
        note = f"rc {full.returncode}; " + (said[0][:160] if said else full.stderr.strip()[-300:])
        if left:
            note += f"; temp files left: {left}"
        if full.returncode == 0:
            return {"trial": i, "intact": None, "clean": None, "note": "everything fitted: no fault"}
        subprocess.run(["mount", "-o", f"remount,size={64 << 20}", str(mnt)], capture_output=True)
        resume = run(train_cmd(kind, mnt, "r", *extra, "--auto-resume"), ws)
        ok, why = resumed_intact(resume, run_dir)
        return {"trial": i, "intact": ok, "clean": is_clean, "note": f"{note}; {why}"}
    finally:
        _umount(mnt)


STOP_LINE = re.compile(r"stopped at step (\d+); checkpoint saved to (\S+); resume with (.+)$")


def trial_sigterm(kind: str, ws: Path, i: int, rng: random.Random) -> dict:
    name = f"sigterm-{kind}-{i}"
    run_dir = ws / "runs" / name
    extra = ["checkpoint.every_steps=5"]
    steps = 60
    proc = subprocess.Popen(train_cmd(kind, ws / "runs", name, *extra, steps=steps), env=env(ws), cwd=ws,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    at = rng.randint(3, steps // 2)
    reached = wait_for(lambda: len(steps_of(run_dir)) >= at, 300, proc)
    if reached:
        os.kill(proc.pid, signal.SIGTERM)  # torchrun forwards it to its workers
    _, err = proc.communicate(timeout=300)
    if not reached:
        return {"trial": i, "intact": None, "clean": None, "note": "ended before the signal: no fault"}
    match = next((m for m in map(STOP_LINE.search, err.splitlines()) if m), None)
    is_clean = exit_says(proc.returncode, err, 143) and match is not None and clean(err)
    if not reached or match is None:
        return {"trial": i, "intact": False, "clean": is_clean,
                "note": f"rc {proc.returncode}; no stop line: {err.strip()[-300:]}"}
    words = shlex.split(match.group(3))
    nproc = KINDS[kind][1]
    # the printed command is `trainspeed ...` or `torchrun ... -m trainspeed ...`: run it as
    # printed, with this interpreter and a free port
    cmd = [*launcher(nproc), *words[words.index("trainspeed") + 1:]]
    resume = run([*cmd, "--no-report"], ws)
    ok, why = resumed_intact(resume, run_dir, steps)
    return {"trial": i, "intact": ok, "clean": is_clean,
            "note": f"stopped at step {match.group(1)}; {why}"
                    + ("" if is_clean else f"; rc {proc.returncode}; stderr: {err.strip()[-600:]}")}


def trial_doctor(kind: str, ws: Path, i: int, rng: random.Random) -> dict:
    script = ws / "doctor_train.py"
    script.write_text(DOCTOR_SCRIPT)
    mnt = ws / f"mnt-doctor-{i}"
    if not _mount(mnt, rng.choice([16, 32, 64, 148]) * 1024):
        return {"trial": i, "intact": None, "clean": None, "note": "no tmpfs (needs root): skipped"}
    try:
        proc = run([sys.executable, "-m", "trainspeed", "doctor", "--steps", "0", "--out", str(mnt / "run"),
                    "--no-html", "--", "python", str(script)], ws)
        said = proc.stderr.count("cannot write the run directory")
        ok = proc.returncode == 0  # the script's own exit code, kept
        return {"trial": i, "intact": ok, "clean": clean(proc.stderr) and said <= 1,
                "note": f"rc {proc.returncode}; 'cannot write' said {said}x; {proc.stderr.strip()[-200:]}"}
    finally:
        _umount(mnt)


def fault_headline(faults: dict[str, dict]) -> dict:
    """The README table's row (label, value, goal, passed; run_all.table) with each fault/kind's
    "k/n intact, k/n clean" as its value."""
    return {"label": "Faults a user meets (kill -9, full disk, SIGTERM, the doctor's full disk) per checkpoint "
                     "kind: resumed intact / said in one line",
            "value": {k: f"{v['intact']}/{v['trials']} intact, {v['clean']}/{v['trials']} clean" for k, v in faults.items()},
            "goal": "every trial intact and clean",
            "passed": all(v["intact"] == v["trials"] == v["clean"] for v in faults.values()) if faults else None}


def merge(names: list[str]) -> None:
    from harness import RESULTS, machine_name

    parts = [json.loads((RESULTS / f"{n}-{machine_name()}.json").read_text()) for n in names]
    results = {**parts[0]["results"], "faults": {}, "parts": [
        {"name": n, "command": p["command"], "date": p["date"]} for n, p in zip(names, parts)]}
    for name, p in zip(names, parts):  # the same fault and kind in two parts: their trials add up
        for key, cell in p["results"]["faults"].items():
            into = results["faults"].setdefault(key, {"trials": 0, "intact": 0, "clean": 0,
                                                      "skipped": 0, "rows": []})
            for k in ("trials", "intact", "clean", "skipped"):
                into[k] += cell[k]
            into["rows"] += [{**row, "part": name} for row in cell["rows"]]
    write_result("faults", results, headline=fault_headline(results["faults"]),
                 command=" ; ".join(p["command"] for p in parts) + " ; python benchmarks/faults.py --merge "
                 + " ".join(names))


FAULTS = {"kill9": trial_kill9, "diskfull": trial_diskfull, "sigterm": trial_sigterm, "doctor": trial_doctor}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5, help="trials per fault and kind (the issue asks 20)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a new temp dir)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="faults", help="results file name (several parts run side by side)")
    ap.add_argument("--merge", nargs="+", metavar="NAME", default=None,
                    help="only merge the results files of parts run side by side (e.g. faults-a "
                         "faults-b) into faults-<machine>.json")
    args = ap.parse_args()
    if args.merge:
        merge(args.merge)
        return
    import tempfile

    ws = Path(args.workdir or tempfile.mkdtemp(prefix="trainspeed-faults-"))
    ws.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    results: dict = {"trials_asked": args.trials, "note": (
        "trials per fault and kind as run on this machine (2 shared cores, loaded by other work); "
        "the issue asks 20 each: rerun with --trials 20 where time allows"), "faults": {}}
    kinds = args.kinds.split(",")
    table: dict[str, list[dict]] = {}
    # trial by trial across every fault and kind: a run stopped part way has them all alike
    for i in range(args.trials):
        for fault in args.faults.split(","):
            for kind in (["-"] if fault == "doctor" else kinds):
                key = f"{fault}/{kind}"
                rows = table.setdefault(key, [])
                t0 = time.monotonic()
                try:
                    row = FAULTS[fault](kind, ws, i, rng)
                except Exception as exc:  # noqa: BLE001 - a harness failure is a result too
                    row = {"trial": i, "intact": False, "clean": False, "note": f"harness: {exc!r}"}
                row["seconds"] = round(time.monotonic() - t0, 1)
                rows.append(row)
                print(f"{fault:9s} {kind:9s} #{i}: intact={row['intact']} clean={row['clean']} "
                      f"({row['seconds']} s) {row['note'][:150]}", flush=True)
                counted = [r for r in rows if r["intact"] is not None]
                results["faults"][key] = {
                    "trials": len(counted), "intact": sum(bool(r["intact"]) for r in counted),
                    "clean": sum(bool(r["clean"]) for r in counted),
                    "skipped": len(rows) - len(counted), "rows": rows}
                write_result(args.name, results, headline=fault_headline(results["faults"]))
    shutil.rmtree(ws / "runs", ignore_errors=True)


if __name__ == "__main__":
    main()
