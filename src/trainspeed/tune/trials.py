"""Trials: one short training run of one config, each in a fresh subprocess (forked from a
server that has imported torch once, where that works: see forkserver.py).

A fresh process per trial gives every setting the same start: empty torch.compile caches,
no memory left over from the previous trial, thread pools sized anew (torch.set_num_threads
is process-global and sticky). The runner is injectable (`Runner` is any callable from a
`TrialRequest` to a `TrialResult`), so the search and its statistics are tested with
synthetic results, while `SubprocessRunner` runs the real `trainspeed train`.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

STDERR_TAIL_LINES = 25
SLOW_CUTOFF = 4.0
"""A trial still running at this many times the baseline trial's wall time (scaled by its
expected cost) is stopped: it is far slower, and finishing it would eat the tune's budget
(fp16 autocast on a CPU without fp16 units ran 60x slower here)."""
FAR_SLOWER = "far slower"
BUDGET_END = "stopped at the end of the tune's budget"

INTERRUPTED = (-2, -15, -int(signal.SIGUSR1), 130, 143, 128 + int(signal.SIGUSR1))
"""Exit statuses of a trial stopped by SIGINT/SIGTERM/SIGUSR1 (killed directly, or via a shell;
SLURM signals every process of a job step: `sbatch --signal=USR1@90`)."""


@dataclass(frozen=True, slots=True)
class TrialRequest:
    """What to run: the base config plus `overrides`, as repeat number `repeat`."""

    key: str
    """Identity of the config (hash of base + overrides); trials with equal keys are repeats."""
    label: str
    """Human name of the setting ("baseline", "precision=bf16-mixed")."""
    overrides: tuple[str, ...]
    """`section.key=value` overrides applied on top of the tune's base config."""
    repeat: int
    """0, 1, ...: which interleaved repeat of this config."""
    timeout_s: float | None = None
    """Stop the trial after this long as far slower than the baseline (None: the runner's cap)."""
    budget_s: float | None = None
    """The tune's budget left when the trial starts: it is stopped there, whatever it is
    (nanoGPT's compile trial compiled for 354 s on a loaded machine and ended a 6m tune at 543 s)."""

    @property
    def name(self) -> str:
        """Run-directory name: unique per (config, repeat)."""
        return f"{self.key}-r{self.repeat}"


@dataclass(slots=True)
class TrialResult:
    """What one trial measured (the resume store keeps these as JSON lines)."""

    key: str
    label: str
    repeat: int
    ok: bool
    error: str | None = None
    """Why it failed: an OOM, a crash with the tail of stderr, a timeout."""
    step_times: list[float] = field(default_factory=list)
    """Step times (s) of the measured steps (warm-up and compile steps excluded)."""
    samples: list[float] = field(default_factory=list)
    """Samples of each measured step."""
    epoch_starts: list[bool] = field(default_factory=list)
    """Per measured step: True when it began an epoch after the run's first (it paid for a
    new loader iterator); empty when none did."""
    steps_per_epoch: int | None = None
    """Optimizer steps per epoch, from the run's epoch events (None: unknown)."""
    loss: float | None = None
    """Parity loss: validation loss at the end when the run evaluated, else the mean
    training loss over the last quarter of its steps."""
    loss_start: float | None = None
    """The mean training loss of the run's first logged steps: the scale a loss difference is
    weighed on when both sides have converged near zero (parity.py)."""
    loss_scatter: float | None = None
    """The parity loss's relative standard error from its tail's per-step scatter
    (optimizer_losses.tail_scatter); None for a validation loss or a short tail."""
    memory_peak: float | None = None
    """Peak memory in bytes: CUDA allocated when on a GPU, else the process RSS."""
    wall_s: float = 0.0
    """Wall time of the whole trial, start-up and compilation included (for the budget)."""
    mfu: float | None = None
    """Model FLOPs utilization at the median measured step (None: FLOPs or peak unknown)."""
    peak_name: str | None = None
    """The peak `mfu` is relative to ("cpu (2 threads) fp32 (measured)", "H100 SXM bf16")."""
    run_dir: str | None = None
    others_load: float | None = None
    """Median CPU other processes used during the measured steps, in cores (the doctor's
    system sampler in a script trial); None when it was not sampled."""
    steps_run: int | None = None
    """Steps the trial ran, warm-up included: losses compare between trials of one length."""
    warmup_s: float | None = None
    """Wall seconds of the warm-up steps (compilation happens there): a one-time cost the
    measured steps leave out (one_time.py)."""
    shape: str | None = None
    """The steps the trial was asked to run (ScriptRunner.shape); None where its key holds
    them (a config tune's trial length is in its config)."""
    loss_optimizer: str | None = None
    """With several optimizers (a GAN's): the one whose loss `loss` is (optimizer_losses.py)."""
    optimizer_losses: dict[str, float | None] = field(default_factory=dict)
    """With several optimizers: each one's own parity loss, by the script's name for it (the
    primary's too); parity judges each (parity.judge_each). Empty with one optimizer."""
    optimizer_loss_starts: dict[str, float | None] = field(default_factory=dict)
    """Each optimizer's starting loss, as `loss_start` is the primary's."""
    optimizer_loss_scatters: dict[str, float | None] = field(default_factory=dict)
    """Each optimizer's loss_scatter."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TrialResult":
        known = {k: data[k] for k in cls.__slots__ if k in data}  # type: ignore[attr-defined]
        return cls(**known)


Runner = Callable[[TrialRequest], TrialResult]


def _finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def result_from_run_dir(request: TrialRequest, run_dir: Path, wall_s: float) -> TrialResult:
    """Read a finished trial's run directory into a TrialResult."""
    from trainspeed.telemetry.rundir import read_run
    from trainspeed.telemetry.summary import flops_per_step, peak_of, system_series
    from trainspeed.telemetry.throughput import mfu
    from trainspeed.tune.optimizer_losses import read_optimizer_losses
    from trainspeed.tune.settle import settled_from
    from trainspeed.tune.trial_load import trial_others_load

    run = read_run(run_dir)
    own = read_optimizer_losses(run)  # several optimizers: each one's loss, judged apart
    base = dict(key=request.key, label=request.label, repeat=request.repeat, wall_s=wall_s, run_dir=str(run_dir),
                loss_optimizer=own.primary, optimizer_losses=own.end, optimizer_loss_starts=own.start,
                optimizer_loss_scatters=own.scatter)
    t = run.array("t_step")
    warm = run.array("warmup") > 0.5
    keep = np.isfinite(t) & ~warm
    unsettled = np.flatnonzero(keep)[:settled_from(t[keep].tolist())]
    warm[unsettled] = True  # slow first steps after the declared warm-up are warm-up too (settle.py)
    keep[unsettled] = False
    if not keep.any():
        from trainspeed.tune.short_run import no_measured_steps

        return TrialResult(ok=False, error=no_measured_steps(run, run_dir, len(t)), **base)
    samples = np.nan_to_num(run.array("samples"), nan=1.0)
    loss, scatter = _parity_loss(run)
    mem = _finite(run.array("mem.cuda_alloc_peak"))
    if not mem.size:
        mem = _finite(run.array("mem.rss"))
    step_numbers = run.array("step")
    starts, per_epoch = _epoch_starts(run, step_numbers)
    # The report's MFU, at the median measured step: None when FLOPs or the peak are unknown,
    # or the result is impossible (over 100 %).
    step_s = float(np.median(t[keep]))
    reading = mfu(flops_per_step(run, keep), step_s, *peak_of(run))
    utilization = reading.value if reading.valid else None
    others_load = trial_others_load(run, keep)  # over the steps' time, not their count (trial_load.py)
    if others_load is None:  # no sampler row inside the steps: its readings over the whole trial
        others = _finite(np.asarray(system_series(run).get("cpu_others", []), dtype=np.float64))
        others_load = float(np.median(others)) / 100 if others.size else None
    return TrialResult(ok=True, others_load=others_load, step_times=t[keep].tolist(), samples=samples[keep].tolist(),
                       epoch_starts=starts[keep].tolist() if starts[keep].any() else [],
                       steps_per_epoch=per_epoch, loss=loss, loss_start=_start_loss(run), loss_scatter=scatter,
                       memory_peak=float(mem.max()) if mem.size else None,
                       mfu=utilization, peak_name=reading.peak_name if utilization else None,
                       steps_run=int(t.size), warmup_s=_warmup_s(run, step_numbers, t, warm, step_s),
                       **base)


def _warmup_s(run: Any, steps: np.ndarray, t: np.ndarray, warm: np.ndarray, step_s: float) -> float | None:
    """Wall seconds of the warm-up steps, the step whose FLOPs were counted (the tune's first
    trial) as one ordinary step: the later trials count none, and their warm-up is priced from
    this (time_sequence_prediction's counted step took 216 s beside 38 s steps, and every trial
    was priced at 338 s instead of ~155 s)."""
    if not warm.any():
        return None
    counted = [e.get("step") for e in run.events_of("flops") if (e.get("data") or {}).get("flops_per_step")]
    times = np.where(np.isin(steps, counted) & (t > step_s), step_s, t)
    return float(np.sum(times[warm & np.isfinite(times)]))


def _epoch_starts(run: Any, steps: np.ndarray) -> tuple[np.ndarray, int | None]:
    """(mask over the run's step records: the first step of every epoch but the run's first,
    steps per epoch) from the trainer's "epoch" events (an event at step s: step s+1 starts it)."""
    events = run.events_of("epoch")
    first = {int(e["step"]) + 1 for e in events[1:] if isinstance(e.get("step"), int)}
    per_epoch = next((int(v) for e in events if isinstance(v := (e.get("data") or {}).get("steps_per_epoch"), int)
                      and v > 0), None)
    return np.isin(steps, sorted(first)), per_epoch


def _start_loss(run: Any, steps: int = 5) -> float | None:
    """The mean of the first `steps` finite training losses the run logged (None: none)."""
    losses = run.array("loss")
    first = losses[np.isfinite(losses)][:steps]
    return float(np.mean(first)) if first.size else None


def _parity_loss(run: Any) -> tuple[float | None, float | None]:
    """(the parity loss, its tail_scatter): the last validation loss (no scatter), else the mean
    training loss over the last quarter of the steps."""
    from trainspeed.tune.optimizer_losses import tail_scatter

    for event in reversed(run.events_of("eval")):
        value = (event.get("data") or {}).get("val_loss")
        if isinstance(value, (int, float)):
            return float(value), None
    losses = run.array("loss")
    if not losses.size:
        return None, None
    tail = losses[-max(1, len(losses) // 4):]
    if np.isnan(tail).all():
        # No loss was logged near the end. A NaN/Inf *value* reads as NaN too, which is
        # exactly what parity must catch, so report NaN when any step logged a non-finite loss.
        return (math.nan if np.isinf(losses).any() else None), None
    if not np.isfinite(tail[~np.isnan(tail)]).all():
        return math.inf, None
    return float(np.nanmean(tail)), tail_scatter(tail)


ONEDNN_NO_KERNEL = "could not create a primitive descriptor"
"""oneDNN's error where it has no implementation of a primitive for the dtypes asked on this CPU
(a bf16 LSTM on a CPU without bf16 support)."""


def _classify_failure(returncode: int, stderr: str, crash: str | None = None) -> str:
    """The failed trial's error: its crash as the run directory recorded it where there is one
    (a doctor trial runs --quiet: its stderr is empty), else the tail of its stderr."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    tail = "\n".join(lines[-STDERR_TAIL_LINES:])
    said = stderr + (crash or "")
    if "out of memory" in said.lower() or "OutOfMemoryError" in said:
        return f"OOM (exit {returncode}): {crash or (lines[-1] if lines else '')}"
    if ONEDNN_NO_KERNEL in said:
        # word_language_model's bf16 trial on a CI CPU: "could not create a primitive descriptor
        # for the LSTM forward propagation primitive", which names neither the cause nor whose it is
        return (f"exit code {returncode}: oneDNN (PyTorch's CPU kernels) has no kernel on this CPU for an op of the "
                f"model in the setting's dtype, so the setting cannot run here; not a fault of the script: "
                f"{crash or _last_error(lines)}")
    if crash:
        return f"exit code {returncode}: {crash}"
    if not tail:
        return f"exit code {returncode}, nothing on stderr"
    # The first line is what the console and the table show: the exception, not "stderr tail:"
    # (a trial that crashed in the doctor's own report read "exit code 1; stderr tail:" there).
    return f"exit code {returncode}: {_last_error(lines)}; stderr tail:\n{tail}"


def _last_error(lines: list[str]) -> str:
    """`NameError: name 'x' is not defined (at bound.py:44)`: the last unindented line (a
    traceback's exception, argparse's error) and the traceback's innermost frame if it has one."""
    import re

    frames = [m for line in lines if (m := re.match(r'\s*File "([^"]+)", line (\d+)', line))]
    error = next((line.strip() for line in reversed(lines) if not line[:1].isspace()), lines[-1].strip())
    return f"{error} (at {Path(frames[-1][1]).name}:{frames[-1][2]})" if frames else error


def _crash_of(run_dir: Path) -> str | None:
    """`RuntimeError: ... (at train.py:243)`: the crash event a run directory holds, with the
    innermost frame of the script's own code (not an installed package's, not trainspeed's), or
    None."""
    import re

    import trainspeed
    from trainspeed.errors import RunDirError
    from trainspeed.patches.callers import in_user_files
    from trainspeed.telemetry.rundir import read_run

    try:
        crashes = read_run(run_dir).events_of("crash")
    except (OSError, RunDirError):
        return None
    ours = str(Path(trainspeed.__file__).resolve().parent)
    for event in reversed(crashes):
        data = event.get("data") or {}
        error = str(data.get("error") or "").strip()
        if not error:
            continue
        frames = re.findall(r'File "([^"]+)", line (\d+)', str(data.get("traceback") or ""))
        own = [(f, n) for f, n in frames if in_user_files((f, int(n))) and not f.startswith((ours, "<"))]
        return f"{error} (at {Path(own[-1][0]).name}:{own[-1][1]})" if own else error
    return None


@dataclass(kw_only=True)
class SubprocessRunner:
    """Runs `python -m trainspeed train BASE.yaml --name N overrides...` per trial."""

    base_config: Path
    """The tune's base config (trial lengths and logging already set)."""
    out_dir: Path
    """Parent of the trial run directories."""
    timeout_s: float = 600.0
    """A trial running longer than this is killed and reported as failed."""
    python: str = sys.executable
    extra_env: dict[str, str] = field(default_factory=dict)
    fork_server: bool = True
    """Fork each trial from a server that imported torch and the engine once (forkserver.py),
    where that works (Linux, no extra environment); otherwise start a fresh interpreter."""
    say: Callable[[str], None] | None = None
    preload: tuple[str, ...] = ()
    """Modules the fork server imports besides its own list: what building the recipe imported
    in the tuner (session.probe_recipe)."""
    _server: Any = field(default=None, init=False, repr=False)

    def command(self, request: TrialRequest) -> list[str]:
        return [self.python, "-m", "trainspeed", *self.arguments(request)]

    def arguments(self, request: TrialRequest) -> list[str]:
        return ["train", str(self.base_config), "--no-report", "--name", request.name,
                f"run.out_dir={self.out_dir}", *request.overrides]

    def _launch(self, request: TrialRequest, limit: float, env: dict[str, str]) -> tuple[int, str]:
        """(exit code, stderr) of the trial: forked from the server when it can be, else a
        fresh interpreter. Raises subprocess.TimeoutExpired past `limit`."""
        from trainspeed.tune import forkserver

        if self._server is not None:
            try:
                stderr_path = self.out_dir / f".{request.name}.stderr"
                stderr_path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    code = self._server.run(self.arguments(request), Path(os.devnull), stderr_path, limit)
                    return code, stderr_path.read_text(errors="replace")
                finally:
                    stderr_path.unlink(missing_ok=True)
            except forkserver.ForkServerError as exc:
                self._give_up_forking(exc)
                _remove_run_dir(self.out_dir / request.name)  # what the lost attempt left
        proc = subprocess.run(self.command(request), capture_output=True, text=True, timeout=limit, env=env)
        return proc.returncode, proc.stderr

    def _start_server(self) -> None:
        """Start the fork server before the first trial's clock starts (it takes a few
        seconds, once), when this runner forks trials at all."""
        from trainspeed.tune import forkserver

        if self._server is not None or not self.fork_server or self.extra_env or not forkserver.available():
            return
        # A preloaded module that starts a thread (or CUDA) at import makes the server unsafe
        # to fork: then once more with the server's own modules only.
        attempts = [self.preload, ()] if self.preload else [()]
        for i, preload in enumerate(attempts):
            try:
                self._server = forkserver.ForkServer(self.python, preload=preload)
                return
            except (forkserver.ForkServerError, OSError) as exc:
                if i == len(attempts) - 1:
                    self._give_up_forking(exc)
                elif self.say is not None:
                    shown = ", ".join(preload[:3]) + (f" and {len(preload) - 3} more" if len(preload) > 3 else "")
                    self.say(f"fork server without the modules it preloads ({shown}): {exc}")

    def preload_more(self, modules: Sequence[str]) -> None:
        """Modules every trial imports, known only after a trial ran (a script's libraries,
        tune/script_facts.py's `modules`): the running server imports them between trials
        (one not yet started, when it starts). One that leaves the server unsafe to fork (a
        thread or CUDA at import) ends it: the next trial starts one with the earlier list."""
        from trainspeed.tune import forkserver

        new = tuple(m for m in dict.fromkeys(modules) if m not in self.preload and m not in forkserver.PRELOAD)
        if not new or not self.fork_server:
            return
        if self._server is not None:
            try:
                self._server.preload(new)
            except forkserver.ForkServerError as exc:
                self.close()
                if self.say is not None:
                    self.say(f"fork server without the script's libraries: {exc}")
                return
        self.preload = (*self.preload, *new)

    def _give_up_forking(self, why: BaseException) -> None:
        self.fork_server = False  # the rest of the tune starts fresh interpreters
        self.close()
        if self.say is not None:
            self.say(f"trials now start as fresh interpreters: {why}")

    def close(self) -> None:
        """Stop the fork server, if one was started."""
        server, self._server = self._server, None
        if server is not None:
            server.close()

    def __call__(self, request: TrialRequest) -> TrialResult:
        run_dir = self.out_dir / request.name
        _remove_run_dir(run_dir)  # a trial interrupted mid-run: its partial records must not count
        env = {**os.environ, **self.extra_env}
        self._start_server()
        t0 = time.perf_counter()
        base = dict(key=request.key, label=request.label, repeat=request.repeat, run_dir=str(run_dir))
        limit = min(self.timeout_s, request.timeout_s or math.inf, request.budget_s or math.inf)
        try:
            returncode, stderr = self._launch(request, limit, env)
        except subprocess.TimeoutExpired:
            if request.budget_s and limit == request.budget_s and limit < (request.timeout_s or math.inf):
                error = f"{BUDGET_END} ({limit:.0f} s left when it started)"
            elif request.timeout_s and limit == request.timeout_s:
                error = f"{FAR_SLOWER}: stopped after {limit:.0f} s, over {SLOW_CUTOFF:g}x the baseline trial's time"
            else:
                error = f"timed out after {limit:.0f} s"
            return TrialResult(ok=False, error=error, wall_s=time.perf_counter() - t0, **base)
        wall = time.perf_counter() - t0
        if returncode in INTERRUPTED:
            # Stopped from outside (Ctrl-C, kill, a job scheduler), not by its setting: not a
            # result. Stop the tune; a rerun with the same --out runs this trial again.
            raise KeyboardInterrupt(f"trial {request.label} was stopped by a signal "
                                    f"(exit {returncode}); rerun to resume")
        if returncode != 0:
            return TrialResult(ok=False, error=_classify_failure(returncode, stderr, _crash_of(run_dir)),
                               wall_s=wall, **base)
        return result_from_run_dir(request, run_dir, wall)


def _remove_run_dir(run_dir: Path) -> None:
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)


def format_override(key: str, value: Any) -> str:
    """`key=value` with the value written as a YAML scalar the config loader reads back."""
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True).strip()
    if text.endswith("\n...") or text.endswith("..."):
        text = text.rsplit("\n", 1)[0].strip()
    return f"{key}={text}"


def overrides_of(settings: dict[str, Any]) -> tuple[str, ...]:
    return tuple(format_override(k, v) for k, v in sorted(settings.items()))


__all__ = ["TrialRequest", "TrialResult", "Runner", "SubprocessRunner", "result_from_run_dir",
           "format_override", "overrides_of"]


