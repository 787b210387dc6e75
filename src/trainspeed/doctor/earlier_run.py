"""A doctor run into a run directory that already holds a run: the earlier one is set aside.

`trainspeed doctor --out DIR` twice (a failed first attempt, the script fixed, the same command
again) appended the second run's records to the first's events.jsonl and steps.jsonl: the
second report showed the first run's "No module named torchvision". Now the earlier run's files
move, untouched, into `DIR/earlier-runs/<its start time>/` (a complete run directory, which
`trainspeed report` and `--compare` read as any other; the new report does not look there),
said in one line, and the KEEP_EARLIER newest earlier runs are kept.

Only trainspeed's own files ever move. A folder that holds anything else (a project folder,
`runs/` itself, an engine run's checkpoints) is refused before anything is written: the run's
config.yaml would overwrite the user's, and setting their files aside would one day prune them.

Under torchrun every rank runs a doctor into DIR. Rank 0 sets the earlier run aside, its
events.jsonl last; rank r > 0 writes ranks/rank<r>/ only once DIR's events.jsonl is no longer the
earlier run's, so that rank 0 never moves a record of this run (wait_for_rank0).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from trainspeed.errors import ConfigError

EARLIER_DIR = "earlier-runs"
KEEP_EARLIER = 3
"""Earlier runs kept under EARLIER_DIR: enough to compare a fix with the last few attempts,
few enough that a rerun loop does not fill the disk (a run with a profile trace is 100s of MB)."""
RUN_FILES = ("config.yaml", "env.json", "steps.jsonl", "steps.csv", "report.json", "report.html",
             "compare.html", "patches.json")
RUN_FOLDERS = ("ranks", "spawned", "launcher", "tb", "wandb")
"""What a doctor (or `run --with --doctor`) writes in its run directory: telemetry/schema.py,
the sinks, telemetry/ranks.py, doctor/spawned.py, cli/run.py's patches.json, report --compare's
HTML; events.jsonl is listed apart, as it moves last. Profile traces: TRACE."""
EVENTS = "events.jsonl"
TRACE = re.compile(r"^profile_steps_\d+-\d+\.json$")
RECORDS = (EVENTS, "steps.jsonl", "report.json")
"""Files whose content shows a trainspeed run (a versioned record): names alone do not (a
project's own config.yaml or tb/)."""
_STAMPED = re.compile(r"^\d{8}-\d{6}(-\d+)?$")
RANK0_WAIT_S = 60.0
"""How long rank r > 0 waits for rank 0 to set the earlier run aside: rank 0 imports torch
first (seconds, more on a loaded machine); past it, the rank goes on (never blocks training)."""


def _ours(name: str) -> bool:
    return name in RUN_FILES or name in RUN_FOLDERS or name == EVENTS or bool(TRACE.match(name))


def _first_record(path: Path) -> dict | None:
    """The first line of a JSONL file (or a JSON file) as a trainspeed record, or None."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read() if path.suffix == ".json" else f.readline()
        record = json.loads(text)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "schema" in record else None


def _started(run_dir: Path) -> float | None:
    """When the run in run_dir started (its run_start record), or None."""
    record = _first_record(run_dir / EVENTS)
    t_wall = record.get("t_wall") if record else None
    return float(t_wall) if isinstance(t_wall, (int, float)) else None


def _refuse_foreign(run_dir: Path, names: list[str]) -> None:
    """ConfigError when run_dir holds anything a trainspeed run does not write."""
    foreign = sorted(n for n in names if not _ours(n) and n != EARLIER_DIR)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ConfigError(f"--out {run_dir} holds files that are not a trainspeed run's ({shown}); the doctor "
                          "would write config.yaml, events.jsonl ... among them. Give --out a new or empty "
                          "folder, or drop --out (the default is runs/doctor-<script>-<time>); nothing was written")


def set_aside_earlier_run(run_dir: str | Path) -> Path | None:
    """Rank 0, before its Monitor starts: move the run that run_dir holds into
    run_dir/earlier-runs/<start time>/ and say so; the folder it went to, or None when run_dir is
    new or empty. Refuses a folder that holds files of the user's (module docstring)."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return None
    if not run_dir.is_dir():
        raise ConfigError(f"--out {run_dir} is a file, not a folder: give --out a new or empty folder; "
                          "nothing was written")
    names = [entry.name for entry in os.scandir(run_dir)]
    _refuse_foreign(run_dir, names)
    ours = [n for n in names if _ours(n)]
    if not any(_first_record(run_dir / n) for n in RECORDS if n in ours):
        # no earlier run here. ranks/ alone may be this run's: a rank r > 0 that started first
        if not [n for n in ours if n != "ranks"]:
            return None  # new, empty, or only earlier-runs/
        raise ConfigError(f"--out {run_dir} holds {', '.join(sorted(ours))} but no trainspeed run records "
                          "(events.jsonl, steps.jsonl, report.json), so they may be yours; give --out a new "
                          "or empty folder, or remove them; nothing was written")
    started = _started(run_dir) or max((run_dir / n).stat().st_mtime for n in ours)
    into = _fresh(run_dir / EARLIER_DIR / time.strftime("%Y%m%d-%H%M%S", time.localtime(started)))
    into.mkdir(parents=True)
    for name in sorted(ours, key=lambda n: n == EVENTS):  # events.jsonl last: wait_for_rank0
        os.replace(run_dir / name, into / name)
    pruned = _prune(run_dir / EARLIER_DIR)
    gone = f"; removed the oldest, {', '.join(pruned)}" if pruned else ""
    print(f"trainspeed: --out {run_dir} held an earlier run: moved it to {into} (this report reads this run "
          f"only; the {KEEP_EARLIER} newest earlier runs are kept{gone})", file=sys.stderr, flush=True)
    return into


def _fresh(path: Path) -> Path:
    n, found = 1, path
    while found.exists():
        n += 1
        found = path.with_name(f"{path.name}-{n}")
    return found


def _prune(earlier: Path) -> list[str]:
    """Remove all but the KEEP_EARLIER newest runs this module set aside (stamped names only:
    anything else under earlier-runs/ is not ours to remove)."""
    def order(name: str) -> tuple[str, int]:  # 20250102-120000-2 is the second run of that second
        return name[:15], int(name[16:] or 1)

    stamped = sorted((e.name for e in os.scandir(earlier) if e.is_dir() and _STAMPED.match(e.name)), key=order)
    removed = stamped[:-KEEP_EARLIER] if len(stamped) > KEEP_EARLIER else []
    for name in removed:
        shutil.rmtree(earlier / name, ignore_errors=True)
    return removed


def wait_for_rank0(run_dir: str | Path, rank: int, timeout_s: float = RANK0_WAIT_S, poll_s: float = 0.2) -> None:
    """Rank r > 0, before its Monitor starts: refuse what rank 0 refuses, then wait while run_dir's
    events.jsonl is an earlier run's (started before this process), i.e. until rank 0 has set
    that run, its ranks/ included, aside; its own ranks/rank<r> is then new."""
    import psutil

    run_dir = Path(run_dir)
    if run_dir.is_dir():
        _refuse_foreign(run_dir, [entry.name for entry in os.scandir(run_dir)])
    born = psutil.Process().create_time()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        started = _started(run_dir)
        if started is None or started >= born:
            return
        time.sleep(poll_s)
    print(f"trainspeed doctor: rank {rank}: {run_dir} still holds an earlier run after {timeout_s:g} s "
          "(rank 0 sets it aside); this rank's records go on beside it", file=sys.stderr, flush=True)
