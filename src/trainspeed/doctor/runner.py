"""Run an unchanged training script under the doctor, in-process (like `python -m cProfile`).

    result = run_doctor(DoctorConfig(command=["python", "train.py", "--lr", "3e-4"], steps=200))

The script runs with `__main__` semantics (runpy), `sys.argv` set to its arguments and its
directory first on `sys.path`. Instrumentation is installed before its first line and removed
afterwards, whatever happens. The run stops after `steps` optimizer steps (a private
BaseException raised from the step hook) or when the script ends; a crash or `sys.exit(code)`
still leaves a complete run directory (report.json carries the traceback), and the doctor's
exit code is the script's.
"""

from __future__ import annotations

import os
import re
import runpy
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from trainspeed.doctor.command_words import is_interpreter, script_words
from trainspeed.doctor.defaults import DEFAULT_STEPS, default_warmup
from trainspeed.doctor.run_facts import (engine_precision_of, exit_code_of, matmul_dtype,  # noqa: F401 - re-exported
                                         record_peak, script_precision_of)
from trainspeed.errors import ConfigError, RunDirError

LAUNCHERS = {
    "torchrun": "torchrun --nproc_per_node N -m trainspeed doctor --out RUN_DIR -- train.py ARGS",
    "deepspeed": "deepspeed --num_gpus N --no_local_rank --module trainspeed doctor --out RUN_DIR -- train.py ARGS",
}
"""Launchers that start one process per rank: the doctor runs inside each rank, under them."""
LAUNCHER_ENV = "TRAINSPEED_LAUNCHER"
"""JSON list of the launcher words the user typed before the script (`["accelerate", "launch",
"--num_processes", "2"]`), set by `doctor -- accelerate launch ...` for the doctor it starts in
each process: recorded in config.yaml as "launcher", so verify commands keep the launcher."""


@dataclass(kw_only=True, slots=True)
class DoctorConfig:
    command: list[str]
    """The script's command line: `python train.py ARGS`, `python -m pkg.mod ARGS`, or `train.py ARGS`."""
    steps: int | None = DEFAULT_STEPS
    """Stop after this many optimizer steps (None: run until the script ends)."""
    max_seconds: float | None = None
    """Also stop once the run is this old, when its warm-up and 3 more steps are done: a
    tune's first trial measures an unknown step time within its budget."""
    out: str | Path | None = None
    """Run directory (default: runs/doctor-<script>-<time>)."""
    log_every: int = 20
    """Steps between flushes of step records to disk (every step is recorded either way)."""
    warmup_steps: int | None = None
    """Steps excluded from throughput; default min(5, steps // 10), at least 1."""
    device: str | None = None
    """Clock for phase timing: "cuda" (CUDA events) or "cpu"; default cuda when available."""
    sinks: tuple[str, ...] = ("jsonl",)
    """Monitor sinks (the run directory's JSONL files are always written)."""
    system_sampler: bool = True
    """Sample CPU/RSS/GPU utilization in a background thread."""
    count_flops: bool = True
    """Count one step's FLOPs (FlopCounterMode over a real step) to report MFU."""
    profile_steps: str | None = None
    """'START-END': a torch.profiler trace of those steps, with trainspeed.<phase> ranges."""
    plan: str | None = None
    """`run --with PLAN`: its settings are applied again in the training processes the script
    starts itself (doctor/spawned.py), as they were in the script's own."""

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("doctor: no command given. Usage: trainspeed doctor -- python train.py ARGS")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"doctor.steps must be >= 1, got {self.steps}")
        if self.log_every < 1:
            raise ConfigError(f"doctor.log_every must be >= 1, got {self.log_every}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ConfigError(f"doctor.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.device is not None and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ConfigError(f"doctor.device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.profile_steps is not None:
            from trainspeed.telemetry.profiling import parse_steps

            start, end = parse_steps(self.profile_steps)  # a ConfigError now, not after the script started
            if self.steps and end > self.steps:
                # a window past the doctor's stop wrote no trace and said nothing (--steps 20 with 50-55)
                first = max(1, self.steps - (end - start))
                raise ConfigError(f"--profile-steps {start}-{end} ends after the doctor's last step (--steps "
                                  f"{self.steps}): no trace would be written. Profile steps inside the run "
                                  f"(--profile-steps {first}-{self.steps}) or run longer (--steps {end})")


@dataclass(slots=True)
class Target:
    kind: str
    """"path" (a script file) or "module" (python -m)."""
    name: str
    args: list[str] = field(default_factory=list)


@dataclass(slots=True)
class DoctorResult:
    exit_code: int
    run_dir: Path
    summary: dict[str, Any]
    findings: list[dict[str, Any]]
    traceback: str | None
    stopped: str
    """"steps" (limit reached), "end" (script finished), "exit" (sys.exit), "crash", "interrupt"
    (Ctrl-C), "signal" (SIGTERM, SIGHUP)."""
    steps: int
    report: dict[str, Any] | None = None
    """What report.json holds, or would hold where the run directory could not be written."""
    unwritable: str | None = None
    """Why the run directory could not be written (a full disk), or None: then its records and
    report.json may be cut short (see `report_written`)."""
    report_written: bool = True


def parse_command(command: Sequence[str]) -> Target:
    """Understand `python [opts] train.py ARGS`, `python -m mod ARGS` and `train.py ARGS`."""
    given = list(command)
    given = given[1:] if given[:1] == ["--"] else given
    if not given:
        raise ConfigError("doctor: no command given. Usage: trainspeed doctor -- python train.py ARGS")
    argv = script_words(given)
    if is_interpreter(given[0]):
        if argv[:1] == ["-c"]:
            raise ConfigError("doctor: `python -c CODE` is not supported; put the code in a file.")
        if not argv:
            raise ConfigError("doctor: the command names no script. Usage: "
                              "trainspeed doctor -- python train.py ARGS")
        if argv[0] == "-m":
            if len(argv) < 2:
                raise ConfigError("doctor: `python -m` needs a module name")
            from trainspeed.doctor.module_lookup import module_missing

            if module_missing(argv[1]):
                raise ConfigError(f"doctor: module {argv[1]!r} not found (cwd: {os.getcwd()}). `python -m` "
                                  "imports it from the cwd or the installed packages: trainspeed doctor -- "
                                  "python -m pkg.train")
            return Target(kind="module", name=argv[1], args=argv[2:])
    script = argv[0]
    launcher = os.path.basename(script)
    if launcher in LAUNCHERS:
        from trainspeed.doctor.launch_forms import rank_form

        form = rank_form(argv, lambda script: str(default_run_dir(Target(kind="path", name=script, args=[]))))
        raise ConfigError(f"doctor: {launcher} starts one process per rank; run the doctor in each of them: "
                          f"{form or LAUNCHERS[launcher]} (rank 0 reports on all ranks). One process: "
                          "trainspeed doctor -- python train.py ARGS")
    if not Path(script).is_file():
        raise ConfigError(f"doctor: script {script!r} not found (cwd: {os.getcwd()}). "
                          "Give the path of the training script: trainspeed doctor -- python train.py")
    return Target(kind="path", name=script, args=argv[1:])


def default_run_dir(target: Target) -> Path:
    stem = Path(target.name).stem if target.kind == "path" else target.name.rsplit(".", 1)[-1]
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", stem) or "script"
    from trainspeed.telemetry.rundir import fresh_run_dir

    return fresh_run_dir(Path("runs") / f"doctor-{stem}-{time.strftime('%Y%m%d-%H%M%S')}")


def execute(target: Target, seen: dict[str, Any] | None = None) -> None:
    """Run the target with `__main__` semantics; restores sys.argv and sys.path afterwards.
    `seen["globals"]`: the script's module globals, however it ended (its config objects);
    `seen["hydra"]`: a Hydra app's composed config, when it was stopped inside its task."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    try:
        if target.kind == "module":
            sys.argv = [target.name, *target.args]
            sys.path.insert(0, os.getcwd())  # what `python -m` puts first
            runpy.run_module(target.name, run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(target.name)
            sys.argv = [target.name, *target.args]
            sys.path.insert(0, os.path.dirname(script))
            try:
                namespace = runpy.run_path(script, run_name="__main__")
            except BaseException as exc:
                if seen is not None:
                    from trainspeed.doctor.instrument.config_objects import script_globals
                    from trainspeed.doctor.instrument.hydra_flags import hydra_task_config

                    seen["globals"] = script_globals(exc.__traceback__, script)
                    seen["hydra"] = hydra_task_config(exc.__traceback__)
                raise
            if seen is not None:
                seen["globals"] = namespace
    finally:
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path


class DoctorSignal(BaseException):
    """SIGTERM arrived while the script ran (`timeout 150 trainspeed doctor ...`): raised from
    the handler so that the run ends like a Ctrl-C, with its report written."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _launcher() -> dict[str, Any]:
    """{"launcher": [...]} when a launcher started this doctor (LAUNCHER_ENV), else {}."""
    import json

    words = json.loads(os.environ.get(LAUNCHER_ENV) or "null")
    return {"launcher": [str(w) for w in words]} if isinstance(words, list) and words else {}


def _plan(path: str | None) -> dict[str, Any]:
    """{"plan": {"path", "settings"}} for a run under `trainspeed run --with PATH --doctor`: the
    report's commands run the script with those settings again (checks/context.py)."""
    if not path:
        return {}
    from trainspeed.patches.plan import load_plan

    return {"plan": {"path": str(path), "settings": sorted(load_plan(path).patch_settings())}}


def run_doctor(config: DoctorConfig) -> DoctorResult:
    """Run the script under instrumentation and diagnose it. See module docstring."""
    from trainspeed.startup import preload

    preload()  # torch and what the script's first optimizer imports, before the script: faster
    import torch

    from trainspeed.doctor.checks import diagnose
    from trainspeed.doctor.checks.bound import time_goes
    from trainspeed.doctor.checks.context import plan_knobs
    from trainspeed.doctor.earlier_run import set_aside_earlier_run, wait_for_rank0
    from trainspeed.doctor.instrument import Session, StopDoctor, install
    from trainspeed.doctor.instrument.files import snapshot
    from trainspeed.doctor.instrument.flags import observe_argv_flags
    from trainspeed.doctor.instrument.import_path import needed_pythonpath
    from trainspeed.doctor.instrument.run_env import carried_env
    from trainspeed.doctor.instrument.imported import library_imports
    from trainspeed.doctor.spawned import adopt_spawned, drop_idle_spawned, follow_spawned
    from trainspeed.doctor.started_ranks import end_started_ranks
    from trainspeed.doctor.instrument.observations import emit_observations
    from trainspeed.doctor.tuned import annotate as annotate_tuned, script_key
    from trainspeed.stop_signals import raise_on_stop_signals
    from trainspeed.telemetry import schema
    from trainspeed.telemetry.monitor import Monitor
    from trainspeed.telemetry.rundir import RunData, read_run, try_write, unwritable_reason, write_json
    from trainspeed.telemetry.summary import summarize

    from trainspeed.telemetry.ranks import rank_dir, wait_for_ranks

    target = parse_command(config.command)
    # Under torchrun every rank runs the doctor: rank r > 0 writes its records under
    # ranks/rank<r>/, rank 0 waits for them and reports on all ranks.
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and config.out is None:
        raise ConfigError(f"the doctor runs as one of WORLD_SIZE={world} processes (torchrun); give "
                          "--out RUN_DIR so that every rank writes into the same run directory")
    run_dir = Path(config.out) if config.out is not None else default_run_dir(target)
    # a rerun into the same --out: the earlier run's records would mix into this run's report
    if rank == 0:
        set_aside_earlier_run(run_dir)
    else:
        wait_for_rank0(run_dir, rank)
    device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    steps = config.steps
    warmup = default_warmup(steps) if config.warmup_steps is None else config.warmup_steps
    flops_at = None
    if config.count_flops and (steps is None or steps >= warmup + 3):
        flops_at = max(1, warmup - 1)  # the counted step is the last warm-up step
    files_before = snapshot(os.getcwd(), exclude=run_dir)
    script_env = carried_env()  # before the script or our patches set anything: what the user ran with
    command = list(config.command[1:] if config.command and config.command[0] == "--" else config.command)

    monitor = Monitor(rank_dir(run_dir, rank), device=device, log_every=config.log_every,
                      sinks=config.sinks if rank == 0 else ("jsonl",), rank=rank,
                      warmup_steps=warmup, config={"command": command, **_launcher(), **_plan(config.plan)},
                      command=command,
                      total_steps=steps, system_sampler=config.system_sampler, kind="doctor",
                      profile_steps=config.profile_steps)
    session = Session(monitor, max_steps=steps, count_flops_at=flops_at,
                      time_limit=(config.max_seconds, warmup + 3) if config.max_seconds else None)
    error: BaseException | None = None
    code, stopped = 0, "end"
    said: str | None = None  # the script's last word when it exited itself (script_exit.py)
    installed = install(session)
    unfollow = follow_spawned({"run_dir": str(run_dir), "device": device, "steps": steps, "warmup": warmup,
                               "log_every": config.log_every, "flops_at": flops_at, "command": command,
                               "script": target.name if target.kind == "path" else None, "args": target.args,
                               "plan": config.plan})
    # SIGTERM and SIGHUP (a closed terminal) end the script's run like a Ctrl-C, with a report
    restore_term = raise_on_stop_signals(DoctorSignal)
    # SLURM's SIGUSR1 (sbatch --signal=USR1@90) too, but only once the script's first step closed,
    # and only where its action is still the default: by then a script that takes it itself
    # (Lightning's SLURM auto-requeue, set where no handler is) has set its own.
    late: list[Any] = []
    session.on_first_step = lambda: late.append(raise_on_stop_signals(DoctorSignal, also=("SIGUSR1",)))
    script_seen: dict[str, Any] = {}
    modules_before = set(sys.modules)
    try:
        execute(target, script_seen)
    except StopDoctor:
        stopped = "steps"
    except DoctorSignal as exc:  # SIGTERM (`timeout`, a scheduler), SIGHUP, SIGUSR1: report what was recorded
        code, stopped = 128 + exc.signum, "signal"
    except SystemExit as exc:
        from trainspeed.doctor.script_exit import exit_message

        code, stopped, said = exit_code_of(exc), "exit", exit_message(exc)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt as exc:
        code, stopped, error = 130, "interrupt", exc
    except BaseException as exc:  # noqa: BLE001 - the script's crash is reported, not ours
        from trainspeed.doctor.user_frames import from_user_frame

        code, stopped, error = 1, "crash", exc.with_traceback(from_user_frame(exc.__traceback__))
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    finally:
        restore_term()
        for undo in late:
            undo()
        # ranks the script started itself wait for this one at their next collective
        # (started_ranks.py); told apart in the environment the script ran in, before uninstall
        ended_ranks = end_started_ranks() if stopped in ("steps", "signal") else 0
        unfollow()
        installed.uninstall()

    trace = None
    summary_line = None
    if error is not None and not isinstance(error, KeyboardInterrupt):  # Ctrl-C is a stop, not a crash
        trace = schema.traceback_text(error)
        summary_line = schema.error_line(error)
    observe_argv_flags(session, target.args, target.name if target.kind == "path" else None,
                       script_seen.pop("globals", None), script_seen.pop("hydra", None))
    script_dir = os.path.dirname(os.path.abspath(target.name)) if target.kind == "path" else os.getcwd()
    emit_observations(monitor, session, files_before=files_before, run_dir=run_dir,
                      stopped=stopped, exit_code=code, max_steps=steps, error=summary_line,
                      pythonpath=needed_pythonpath(script_dir), env=script_env, ended_ranks=ended_ranks, said=said)
    record_peak(monitor, session.observations.values(), device)
    monitor.event("observation", kind="imports", library=library_imports(modules_before))
    if rank > 0:  # rank 0 reads this rank's records and reports
        summary = monitor.close(error=error)
        return DoctorResult(exit_code=code, run_dir=run_dir, summary=summary, findings=[],
                            traceback=trace, stopped=stopped, steps=monitor.steps_done)
    missing = wait_for_ranks(run_dir, world) if world > 1 else []
    if missing:
        monitor.event("warning", message=f"ranks {missing} did not finish their records within 30 s; "
                                         "their per-rank figures are partial")
    found = script_precision_of(session.observations.values())
    if found is not None:  # run_start's is the Monitor's fp32 (script_precision_of)
        monitor.event("precision", precision=found[0], source=found[1])
    summary = monitor.close(error=error)
    error = None  # drop the frames (and DataLoader workers) the traceback holds
    steps_done = monitor.steps_done
    try:
        if not steps_done and adopt_spawned(run_dir):  # trained in processes it started (spawned.py)
            summary = summarize(read_run(run_dir))
            steps_done = int(summary.get("steps") or 0)
        elif steps_done:
            drop_idle_spawned(run_dir)
        run = read_run(run_dir)
    except (OSError, RunDirError):  # the run directory could not be written: what was kept
        run = RunData(path=run_dir, steps=list(monitor.recent))
    findings = diagnose(run, summary)
    goes = time_goes(run, summary)  # the report's first statement (checks/bound.py)
    # each finding and the top's "Measure it" carry, in place, what a tune of this script measured
    # (doctor/tuned.py): the top kept "DataLoader workers (now 0)" after a tune read workers at 0.53x
    annotate_tuned([*findings, *([goes] if goes else [])], script_key(target.kind, target.name),
                   command=command, applied=plan_knobs((run.config or {}).get("plan")))
    report = {
        "schema": schema.SCHEMA_VERSION,
        "kind": "doctor",
        "summary": summary,
        "time_goes": goes,
        "findings": findings,
        "traceback": trace,
        "doctor": {"command": command, "stopped": stopped, "exit_code": code, "error": summary_line,
                   "steps": steps_done, "max_steps": steps},
    }
    written = try_write(run_dir, write_json, run_dir / schema.REPORT_JSON, report) is not None
    return DoctorResult(exit_code=code, run_dir=run_dir, summary=summary, findings=findings,
                        traceback=trace, stopped=stopped, steps=steps_done, report=report,
                        unwritable=unwritable_reason(run_dir), report_written=written)
