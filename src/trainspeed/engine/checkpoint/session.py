"""CheckpointSession: the few calls the Trainer makes, wiring manager, signals and Monitor.

    ckpt = CheckpointSession.from_config(cfg.checkpoint, run_dir, monitor=mon,
                                         on_checkpoint=lambda info: fire(Event.CHECKPOINT, ...))
    resumed = ckpt.resume(model, optimizer, scheduler, precision)   # None: fresh start
    if resumed: counters, sampler_state = resumed.counters, resumed.sampler
    make_state = lambda: build_checkpoint(model, optimizer, scheduler, precision, counters_now(),
                                          bundle.state_dict(), config_dict, config_digest=...)
    with ckpt:                                   # SIGTERM/Ctrl-C -> save at the next boundary
        for step ...:
            ...train...
            ckpt.step_end(step, make_state, metrics)   # periodic save, or signal save + exit
        ckpt.finish(step, make_state, metrics)          # save_final
    # on an exception: ckpt.crash(exc, step, make_state) before re-raising

`make_state` is called only when a checkpoint is actually written, so steps without a save
cost one integer comparison. Save time is charged to the Monitor's "ckpt" phase.

Sharded (FSDP) runs: `make_state` returns a ShardedState and every rank saves its shards
(manager.save_sharded). Saves that a rank would decide alone (signal, crash) must then be
agreed on by all ranks first, or some ranks would wait in the save's collectives for ranks
that never come: `agree_signal(requested, step)` and `agree_crash(exc)` are those agreements
(collectives the Trainer provides); without them signal and crash saves are rank 0's alone.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainspeed.engine.checkpoint.emergency import EmergencySaver, is_oom
from trainspeed.engine.checkpoint.manager import CheckpointManager, SaveResult
from trainspeed.engine.checkpoint.sharded import ShardedIO, ShardedState, is_sharded_checkpoint
from trainspeed.engine.checkpoint.space import says_no_space
from trainspeed.engine.checkpoint.stop import resume_command
from trainspeed.engine.checkpoint.state import TrainState, restore_checkpoint
from trainspeed.engine.checkpoint.without_manifest import load_named
from trainspeed.errors import CheckpointError, ConfigError

StateFn = Callable[[], dict[str, Any]]


@dataclass(slots=True)
class Resumed:
    path: Path
    counters: TrainState
    sampler: Any
    """The data layer's state (LoaderBundle.state_dict()) saved with the checkpoint, or None."""
    checkpoint: dict[str, Any]


class CheckpointSession:
    """Resume, periodic/signal/crash/final saves and event routing for one training run."""

    def __init__(self, manager: CheckpointManager, *, monitor: Any = None,
                 resume: str | None = None, auto_resume: bool = False,
                 save_on_crash: bool = True, handle_signals: bool = True, requeue: bool = True,
                 on_checkpoint: Callable[[dict[str, Any]], None] | None = None,
                 writer: bool = True, sharded: ShardedIO | None = None,
                 agree_signal: Callable[[bool, int], bool] | None = None,
                 agree_crash: Callable[[BaseException], str | None] | None = None):
        self.manager = manager
        manager.sharded = sharded
        self._metric_said = False  # best_metric missing from a save's metrics: said once
        self.agree_signal = agree_signal
        """(signal seen on this rank, step) -> whether every rank saves and exits now; the same
        answer on every rank (a collective), called at every step boundary."""
        self.agree_crash = agree_crash
        """exception -> None when every rank crashed in the same way and the crash save may
        run, else the reason it may not (a collective)."""
        # Data parallel: only rank 0 writes; the other ranks still call make_state at every
        # save (under FSDP gathering the state is a collective they must join).
        self.writer = writer
        self.monitor = monitor
        self.resume_spec, self.auto_resume = resume, auto_resume
        self.save_on_crash = save_on_crash
        self.requeue = requeue
        """Under SLURM, requeue the job after SIGUSR1's save (slurm.py)."""
        self.on_checkpoint = on_checkpoint
        self.emergency = EmergencySaver(enabled=handle_signals)
        self.stopping: tuple[int, Path] | None = None
        """(step, checkpoint) once a signal's save is written and the run is to leave."""
        self.run_name: str | None = None
        """The run directory's name, for the resume command a stop prints (set by the Trainer)."""
        self.every_step = (manager.every_steps is not None or manager.every_minutes is not None
                           or agree_signal is not None)
        """Whether step_end has work at every step boundary (periodic saves, a signal
        agreement); when False it has work only once `emergency.signum` is set, and a loop may
        skip the call until then."""
        manager.on_event = self._route  # events reach the Monitor on the training thread

    @classmethod
    def from_config(cls, cfg: Any, run_dir: str | Path | None, *, monitor: Any = None,
                    handle_signals: bool = True,
                    on_checkpoint: Callable[[dict[str, Any]], None] | None = None,
                    writer: bool = True, **kwargs: Any) -> CheckpointSession:
        """From a CheckpointConfig (or any object with its attributes); `kwargs`: sharded,
        agree_signal, agree_crash."""
        manager = CheckpointManager.from_config(cfg, run_dir, writer=writer)
        return cls(manager, monitor=monitor, resume=cfg.resume, auto_resume=cfg.auto_resume,
                   save_on_crash=cfg.save_on_crash, handle_signals=handle_signals,
                   requeue=getattr(cfg, "requeue", True),
                   on_checkpoint=on_checkpoint, writer=writer, **kwargs)

    # -- events ---------------------------------------------------------------------------------
    def _route(self, event: dict[str, Any]) -> None:
        data = {k: v for k, v in event.items() if k != "type"}
        if self.monitor is not None:
            self.monitor.event(event["type"], **data)
        if event["type"] == "checkpoint" and event.get("kind") == "save" and self.on_checkpoint:
            self.on_checkpoint(data)

    def _phase(self):
        return self.monitor.phase("ckpt") if self.monitor is not None else nullcontext()

    # -- resume ---------------------------------------------------------------------------------
    def resume(self, model: Any, optimizer: Any = None, scheduler: Any = None, scaler: Any = None,
               *, map_location: Any = "cpu") -> Resumed | None:
        """Restore from checkpoint.resume / auto_resume; None when starting fresh."""
        path = self.manager.resolve_resume(self.resume_spec, auto_resume=self.auto_resume)
        if path is None:
            return None
        verified_by = None  # None: by its manifest (or the marker's, sharded)
        if is_sharded_checkpoint(path):
            sharded = self.manager.sharded
            if sharded is None:
                raise CheckpointError(f"{path} is a sharded (DCP) checkpoint; resuming it needs "
                                      "the Trainer (or a CheckpointSession given sharded=ShardedIO)")
            ckpt = sharded.load(path)  # model and optimizer, into the live objects
            counters = restore_checkpoint(ckpt, None, None, scheduler, scaler)
        else:
            # A file the user named may have come without its manifest: then it is verified by
            # its own CRC-32s (without_manifest.py); a file with one is verified by it, as ever.
            ckpt, manifest = load_named(path, map_location=map_location)
            counters = restore_checkpoint(ckpt, model, optimizer, scheduler, scaler)
            verified_by = manifest.get("verified_by")
        self._route({"type": "restart", "path": str(path), "from_step": counters.step,
                     "skipped_corrupt": list(self.manager.skipped),
                     **({"verified_by": verified_by} if verified_by else {})})
        if self.writer:
            skipped = len(self.manager.skipped)
            print(f"trainspeed: resumed from {path} at step {counters.step}"
                  + (f" (skipped {skipped} damaged checkpoint{'s' * (skipped > 1)})" if skipped else "")
                  + (f" ({Path(path).name}.json was not beside it: verified by the {verified_by}s "
                     "the file records)" if verified_by else ""),
                  file=sys.stderr, flush=True)
        return Resumed(path=Path(path), counters=counters, sampler=ckpt.get("sampler"), checkpoint=ckpt)

    # -- saves ----------------------------------------------------------------------------------
    def _save(self, step: int, make_state: StateFn, metrics: dict[str, Any] | None,
              reason: str, *, wait: bool) -> SaveResult:
        if metrics and self.manager.keep_best and self.manager.best_metric not in metrics and not self._metric_said:
            # checkpoint.best_metric=val_los: keep_best kept nothing, without a word
            from trainspeed.config_io import did_you_mean

            self._metric_said = True
            named = sorted(k for k in metrics if not k.startswith("_"))  # _at_step: when they were measured
            guess = did_you_mean(self.manager.best_metric, named)
            self._route({"type": "warning", "kind": "best_metric_missing", "message": (
                f"checkpoint.best_metric={self.manager.best_metric!r} is not among this checkpoint's metrics "
                f"({', '.join(named)}){f'; did you mean {guess!r}?' if guess else ''}: keep_best keeps "
                "no checkpoint for it")})
        with self._phase():
            state = make_state()
            if isinstance(state, ShardedState):  # every rank writes its shards
                result = self.manager.save_sharded(state, step, metrics, reason=reason)
                if wait:
                    self.manager.wait()
                return result
            if not self.writer:
                # keep the schedule in step with rank 0's (which updates these in save())
                self.manager._last_step, self.manager._last_save_t = step, self.manager._clock()
                return SaveResult(path=self.manager.path_for(step), step=step, blocking_s=0.0,
                                  write_s=0.0, async_save=False, skipped=True)
            result = self.manager.save(state, step, metrics, reason=reason)
            if wait:
                self.manager.wait()
        return result

    def step_end(self, step: int, make_state: StateFn,
                 metrics: dict[str, Any] | None = None, *, defer_exit: bool = False) -> SaveResult | None:
        """Call at every step boundary. Saves when due; after SIGTERM/SIGINT saves, waits for
        the write and leaves via SystemExit(143) / KeyboardInterrupt. With `defer_exit` it
        returns instead (`self.stopping` is set) and the caller calls `leave()` once the step
        is recorded: the step the signal ended has its record like every other."""
        # EmergencySaver.requested without its property frame: this runs every step
        requested = self.emergency.signum is not None
        if self.agree_signal is not None:
            requested = self.agree_signal(requested, step)
        if requested:
            result = self._save(step, make_state, metrics, "signal", wait=True)
            self._route({"type": "warning", "kind": "signal_exit",
                         "signal": self.emergency.signal_name or "SIGTERM (another rank's)",
                         "at_step": step})
            self.manager.close()
            self.stopping = (step, result.path)
            if not defer_exit:
                self.leave()
            return result
        if self.manager.should_save(step):
            return self._save(step, make_state, metrics, "periodic", wait=False)
        return None

    def leave(self) -> None:
        """After a signal's save: say where it went and how to go on (one line, the writer
        rank), then leave the way the signal asked (SystemExit(143) / KeyboardInterrupt)."""
        step, path = self.stopping
        exc: BaseException = (KeyboardInterrupt() if self.emergency.signum == signal.SIGINT
                              else SystemExit(self.emergency.exit_code or 143))
        if self.writer:
            line = f"trainspeed: stopped at step {step}; checkpoint saved to {path}; "
            requeued = self._requeue()
            if requeued is not None and requeued[1] is None:
                line += f"requeued SLURM job {requeued[0]}: it continues from this checkpoint when it starts again"
            else:
                why_not = f"not requeued ({requeued[1]}); " if requeued is not None else ""
                line += f"{why_not}resume with {resume_command(path, self.run_name)}"
            try:  # after SIGHUP the terminal may be gone (EIO): the checkpoint is saved either way
                print(line, file=sys.stderr, flush=True)
            except OSError:
                pass
            exc.reported = True  # the CLI adds no second line
        raise exc

    def _requeue(self) -> tuple[str, str | None] | None:
        """After SIGUSR1's save under SLURM: requeue the job. (job id, None) once requeued,
        (job id, why not) where scontrol failed; None where no requeue applies."""
        from trainspeed.engine.checkpoint import slurm

        job = slurm.job_id()
        if not (self.requeue and job and self.emergency.signal_name == slurm.REQUEUE_SIGNAL):
            return None
        why_not = slurm.requeue(job)
        self._route({"type": "requeue", "job": job, "error": why_not})
        return job, why_not

    def crash(self, exc: BaseException, step: int, make_state: StateFn) -> Path | None:
        """Best-effort save after training raised. Skipped for OOM (the state may not even fit
        in memory to copy) and when disabled; never raises (the original error matters)."""
        if (not self.save_on_crash or is_oom(exc) or isinstance(exc, (KeyboardInterrupt, SystemExit))
                or (step == 0 and isinstance(exc, ConfigError))):  # a setup mistake before a step: nothing to keep
            self._close_quietly()
            if isinstance(exc, KeyboardInterrupt) and not getattr(exc, "reported", False):
                self._interrupted(exc, step)
            return None
        if says_no_space(exc):  # a save into a full disk fails the same way, after a long write
            self._route({"type": "warning", "kind": "crash_save_skipped", "error": str(exc)})
            self._close_quietly()
            self._name_kept(exc)
            return None
        if self.agree_crash is not None:
            why_not = self.agree_crash(exc)
            if why_not is not None:
                self._route({"type": "warning", "kind": "crash_save_skipped", "error": why_not})
                self._close_quietly()
                return None
        try:
            try:
                self.manager.wait()  # a pending periodic write first
            except CheckpointError:
                pass
            result = self._save(step, make_state, None, "crash", wait=True)
            return result.path
        except Exception as err:  # noqa: BLE001 - the training error is the one to report
            self._route({"type": "warning", "kind": "crash_save_failed", "error": repr(err)})
            return None
        finally:
            self._close_quietly()

    def _kept(self, when: str = "once there is space, ") -> str | None:
        """'the last checkpoint written, step N (PATH), is kept: {when}resume with CMD', or None
        when there is none (or this rank does not write)."""
        if not self.writer:
            return None
        from trainspeed.engine.checkpoint.listing import list_checkpoints

        try:
            kept = [c for c in list_checkpoints(self.manager.directory) if c.manifest is not None]
        except OSError:
            return None
        if not kept:
            return None
        last = kept[-1]
        return (f"the last checkpoint written, step {last.step} ({last.path}), is kept: {when}"
                f"resume with {resume_command(last.path, self.run_name)}")

    def _name_kept(self, exc: BaseException) -> None:
        """A full disk ended the run: its error line goes on to name the last checkpoint written
        whole (a failed save never replaces it) and the command that resumes from it once there
        is space. It said only 'no space left on DIR ... free space there', and nothing of the
        step-2 checkpoint the step-4 save had left intact, nor of --auto-resume."""
        kept = self._kept()
        if kept is None:
            return
        if isinstance(exc, CheckpointError) and len(exc.args) == 1:
            exc.args = (f"{exc.args[0]}; {kept}",)
        elif isinstance(exc, OSError) and exc.strerror:
            exc.strerror += f"; {kept}"

    def _interrupted(self, exc: BaseException, step: int) -> None:
        """A second Ctrl-C (or one with no handler of ours) ended the run before its save: the
        line names the checkpoint a resume takes, where it said only 'trainspeed: interrupted'."""
        kept = self._kept(when="")
        if kept is None:
            return
        try:
            print(f"trainspeed: interrupted at step {step}; {kept}",
                  file=sys.stderr, flush=True)
        except OSError:
            return
        exc.reported = True  # type: ignore[attr-defined]  # the CLI adds no second line

    def finish(self, step: int, make_state: StateFn, metrics: dict[str, Any] | None = None) -> None:
        """End of training: final save (checkpoint.save_final), then wait for every write."""
        if self.manager.save_final:
            self._save(step, make_state, metrics, "final", wait=True)
        self.manager.close()

    def _close_quietly(self) -> None:
        try:
            self.manager.close()
        except CheckpointError as err:
            self._route({"type": "warning", "kind": "checkpoint_failed", "error": repr(err)})

    # -- signals --------------------------------------------------------------------------------
    def __enter__(self) -> CheckpointSession:
        self.emergency.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.emergency.__exit__(*exc)
