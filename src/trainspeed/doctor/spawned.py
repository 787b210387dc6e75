"""Training that runs in processes the script starts itself: the doctor follows it there.

pytorch/examples' mnist_hogwild trains in `mp.Process(target=train, ...)` children started with
the spawn method, as DDP scripts do with `torch.multiprocessing.spawn(main, nprocs=N)`. The
doctor ran in the script's own process only and reported "0 training forwards ... (an
inference-only script?)" after the whole epoch had run, with advice to mark steps that the
children would never have counted.

While the script runs, every process it starts with the spawn or forkserver method (a fresh
interpreter: nothing of the doctor's is in it) gets its target wrapped: the child runs the
target under its own doctor session, with the same --steps, into `spawned/<i>` of the run
directory. DataLoader workers and other library processes are left alone. A forked child
inherits the parent's hooks and is not followed.

When the script's own process trained no step, the run directory adopts the children's
records as a data-parallel run's (telemetry/ranks.py): the first process that trained is rank
0 (its files move to the top), the others ranks/rank<i>, and the script's own records move to
`launcher/`. Report, rank table and findings then read them as they read torchrun's ranks.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from trainspeed.telemetry.sampler import RUN_ROOT_PID_ENV

SPAWNED_DIR = "spawned"
LAUNCHER_DIR = "launcher"
_LIBRARY_TARGETS = ("torch.", "multiprocessing.", "concurrent.", "trainspeed.", "psutil.")
_TORCH_SPAWN_WRAP = ("torch.multiprocessing.spawn", "_wrap")
"""torch.multiprocessing.spawn's per-process entry `_wrap(fn, i, args, error_file)`: the
user's function runs in it as process i."""

__all__ = ["LAUNCHER_DIR", "SPAWNED_DIR", "adopt_spawned", "drop_idle_spawned", "follow_spawned", "run_spawned"]


def _followed(target: Any) -> bool:
    module = getattr(target, "__module__", None) or ""
    if (module, getattr(target, "__name__", "")) == _TORCH_SPAWN_WRAP:
        return True
    return target is not None and not module.startswith(_LIBRARY_TARGETS)


def _fresh_interpreter(process: Any) -> bool:
    """Does this process start as a new interpreter (spawn, forkserver)?"""
    import multiprocessing

    method = getattr(process, "_start_method", None) or multiprocessing.get_start_method(allow_none=True)
    if method is None:
        method = multiprocessing.get_context().get_start_method()
    return method in ("spawn", "forkserver")


def follow_spawned(spec: dict[str, Any]) -> Callable[[], None]:
    """Wrap the targets of the processes the script starts (see module docstring) until the
    returned undo is called. `spec`: run_dir, device, steps, warmup, log_every, flops_at,
    script, args."""
    from multiprocessing.process import BaseProcess

    original = BaseProcess.start
    count = [0]

    def start(self: Any) -> None:
        target = getattr(self, "_target", None)
        if _followed(target) and _fresh_interpreter(self):
            index = count[0]
            if (getattr(target, "__module__", None), getattr(target, "__name__", "")) == _TORCH_SPAWN_WRAP:
                index = int(self._args[1])  # mp.spawn's process number
            count[0] += 1
            self._target = functools.partial(run_spawned, spec, index, target)
        return original(self)

    BaseProcess.start = start  # type: ignore[method-assign]
    # the followed children's samplers count this process's whole tree (their sibling trainers)
    # as the run, not as other processes' load
    os.environ[RUN_ROOT_PID_ENV] = str(os.getpid())

    def undo() -> None:
        BaseProcess.start = original  # type: ignore[method-assign]
        os.environ.pop(RUN_ROOT_PID_ENV, None)

    return undo


def run_spawned(spec: dict[str, Any], index: int, target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """In a child the script started: run `target` under a doctor session of its own. Where the
    session cannot be set up (an unwritable run directory, a bad plan), the target runs as it
    would without the doctor: following a process must never stop it."""
    from trainspeed.doctor.instrument import Session, StopDoctor, install
    from trainspeed.doctor.run_facts import exit_code_of
    from trainspeed.telemetry.monitor import Monitor

    out = Path(spec["run_dir"]) / SPAWNED_DIR / str(index)
    try:
        monitor = Monitor(out, device=spec["device"], log_every=spec["log_every"], sinks=("jsonl",), rank=index,
                          warmup_steps=spec["warmup"], config={"command": spec["command"], "spawned": index},
                          command=spec["command"], total_steps=spec["steps"], kind="doctor")
        session = Session(monitor, max_steps=spec["steps"], count_flops_at=spec["flops_at"])
        applied, settings = _apply_plan(spec.get("plan"))
        installed = install(session)
    except Exception as exc:  # noqa: BLE001 - reported, and the script's process goes on unobserved
        print(f"trainspeed doctor: process {index} runs unobserved: {type(exc).__name__}: {exc}", file=sys.stderr)
        return target(*args, **kwargs)
    stopped, code, error, result = "end", 0, None, None
    try:
        result = target(*args, **kwargs)
    except StopDoctor:
        stopped = "steps"  # this process's --steps: it ends here, as the script's own would
    except SystemExit as exc:  # the target's own exit: its status, raised again below
        stopped, code, error = "exit", exit_code_of(exc), exc
    except BaseException as exc:  # noqa: BLE001 - recorded, then raised as the script would see it
        stopped, code, error = "crash", 1, exc
    finally:
        installed.uninstall()
        if applied is not None:
            applied.uninstall()
            _write_notes(out, settings, applied.notes)
    crashed = error if stopped == "crash" else None
    _finish(monitor, session, spec, out, stopped, code, crashed)
    if error is not None:
        raise error
    return result


def _finish(monitor: Any, session: Any, spec: dict[str, Any], out: Path, stopped: str, code: int,
            error: BaseException | None) -> None:
    """The child's observations, peak and precision, then its records closed (as run_doctor does)."""
    from trainspeed.doctor.instrument.flags import observe_argv_flags
    from trainspeed.doctor.instrument.observations import emit_observations
    from trainspeed.doctor.run_facts import record_peak, script_precision_of
    from trainspeed.telemetry.schema import error_line

    observe_argv_flags(session, spec["args"], spec["script"], None, None)
    summary_line = error_line(error) if error is not None else None
    emit_observations(monitor, session, files_before=None, run_dir=out, stopped=stopped, exit_code=code,
                      max_steps=spec["steps"], error=summary_line)
    record_peak(monitor, session.observations.values(), spec["device"])
    found = script_precision_of(session.observations.values())
    if found is not None:
        monitor.event("precision", precision=found[0], source=found[1])
    monitor.close(error=error, findings=[])


def _apply_plan(path: str | None) -> tuple[Any, dict[str, Any]]:
    """(the installed handle, the settings) of `run --with PLAN`'s patch settings, installed in
    this process too; (None, {}) without a plan."""
    if not path:
        return None, {}
    from trainspeed.patches import install_settings
    from trainspeed.patches.plan import load_plan

    plan = load_plan(path)
    settings = plan.patch_settings()
    return install_settings(settings, plan.targets, say=lambda text: None), settings


def _write_notes(out: Path, settings: dict[str, Any], notes: list[str]) -> None:
    """What each setting did in this process, where `run --with` keeps it (the tuner reads it)."""
    import json

    from trainspeed.fileio import atomic_write_text

    atomic_write_text(out / "patches.json", json.dumps({"settings": settings, "notes": list(notes)},
                                                       indent=2, default=str) + "\n")


def _steps_in(folder: Path) -> int:
    try:
        with open(folder / "steps.jsonl", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _append_event(into: Path, data: dict[str, Any]) -> None:
    """One observation event appended to a closed run's events.jsonl: the checks read it (a
    verify command then runs the script as typed, not under torchrun: it starts its processes)."""
    import json
    import time

    from trainspeed.telemetry import schema

    with open(into, "a", encoding="utf-8") as f:
        f.write(json.dumps(schema.make_event("observation", None, time.time(), **data)) + "\n")


def _carry_flags(source: Path, into: Path) -> None:
    """The script's flags as its own process parsed them (argparse, with types and defaults),
    appended to the adopted records when the children saw none: they got the parsed namespace."""
    import json

    def flag_events(path: Path) -> list[str]:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            return []
        return [line for line in lines if '"script_flags"' in line
                and (json.loads(line).get("data") or {}).get("kind") == "script_flags"]

    carried = flag_events(source)
    if carried and not flag_events(into):
        with open(into, "a", encoding="utf-8") as f:
            f.write("\n".join(carried) + "\n")


def adopt_spawned(run_dir: Path) -> int:
    """Make the followed children's records the run's (module docstring) when any trained;
    how many processes were adopted (0: nothing moved)."""
    from trainspeed.telemetry.ranks import RANKS_DIR

    spawned = run_dir / SPAWNED_DIR
    trained = sorted((p for p in spawned.iterdir() if p.name.isdigit() and _steps_in(p)),
                     key=lambda p: int(p.name)) if spawned.is_dir() else []
    if not trained:
        return 0
    launcher = run_dir / LAUNCHER_DIR
    launcher.mkdir(exist_ok=True)
    for item in list(run_dir.iterdir()):
        if item.is_file():
            shutil.move(str(item), launcher / item.name)
    for item in trained[0].iterdir():
        shutil.move(str(item), run_dir / item.name)
    for k, folder in enumerate(trained[1:], start=1):
        target = run_dir / RANKS_DIR / f"rank{k}"
        target.parent.mkdir(exist_ok=True)
        shutil.move(str(folder), target)
    shutil.rmtree(spawned, ignore_errors=True)
    _carry_flags(launcher / "events.jsonl", run_dir / "events.jsonl")
    _append_event(run_dir / "events.jsonl", {"kind": "spawned_trainers", "processes": len(trained),
                                             "launcher": LAUNCHER_DIR})
    print(f"trainspeed doctor: the script trained in {len(trained)} process(es) it started itself; "
          f"the report reads them as ranks (the script's own process: {launcher})", file=sys.stderr)
    return len(trained)


def drop_idle_spawned(run_dir: Path) -> None:
    """When the script's own process trained: the records of the processes it started that
    trained no step (a helper, a data producer) are removed; any that trained stay in spawned/."""
    spawned = run_dir / SPAWNED_DIR
    if not spawned.is_dir():
        return
    for folder in spawned.iterdir():
        if folder.is_dir() and not _steps_in(folder):
            shutil.rmtree(folder, ignore_errors=True)
    if not any(spawned.iterdir()):
        spawned.rmdir()
