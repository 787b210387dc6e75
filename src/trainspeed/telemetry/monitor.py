"""`Monitor`: the public telemetry API for any training loop.

    mon = Monitor("runs/exp1", log_every=50)
    for batch in mon.loader(loader):            # time spent in next() -> phase "data"
        with mon.phase("h2d"):
            batch = batch.to(device, non_blocking=True)
        with mon.phase("forward"):
            loss = model(batch)
        with mon.phase("backward"):
            loss.backward()
        with mon.phase("optimizer"):
            opt.step(); opt.zero_grad()
        mon.step(samples=len(batch), loss=loss)  # no sync: the loss stays on the device
    summary = mon.close()

Per-step state lives in preallocated arrays sized by `log_every`; at each log interval the
pending steps are resolved in one go (one deliberate sync on CUDA, one `.tolist()` for the
losses), turned into records and handed to the background writer. Nothing grows with the
number of steps.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import deque
from functools import partial
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from trainspeed.errors import ConfigError
from trainspeed.telemetry import rundir, schema
from trainspeed.telemetry.loader_facts import observe_loader
from trainspeed.telemetry.monitor_setup import is_cuda as _is_cuda
from trainspeed.telemetry.monitor_setup import make_profile_window, make_sampler, make_writer
from trainspeed.telemetry.phase_context import (PHASE_INDEX, HookedMarkPhase, MarkPhase, Phase, PhaseTable,
                                               unknown_phase)
from trainspeed.telemetry.records import pending_rows, step_records
from trainspeed.telemetry.schema import MEASURED_PHASES, PHASES
from trainspeed.telemetry.timeline import OTHER, STEP_END, CpuTimeline, CudaTimeline, end_code

_perf_counter = time.perf_counter
# CPU seconds of this process (all its threads) at a step's end: beside the wall time it
# tells a slower script from a busy machine (0.65 µs a call in a warm loop; see CPU_READ_EVERY_S).
_process_time = time.process_time
CPU_READ_EVERY_S = 0.02
"""The process CPU clock is read at a step's end once this much wall time has passed since the
last reading: a system call that costs 5-8 µs on a VM right after the step's torch ops (0.6 µs
in a warm loop), so 1-3 ms steps share a reading (records.step_cpu splits it evenly) and steps
of 20 ms or more are each read. The system sampler's rows, which say whether other processes
took the cores, are a fraction of a second apart: finer CPU readings add nothing to
telemetry/contention.py's judgement. At 5 ms the reading cost 2-4 µs per 2-3.5 ms step."""

# Upper bound on steps held between flushes, whatever log_every is: bounds memory and the
# delay before records reach disk.
_MAX_PENDING = 1000

# A pending step's loss copied into the device buffer (read back at flush), as its row holds it.
_ON_DEVICE = object()


class Monitor:
    """Times the phases of every step and writes the run directory. See module docstring."""

    def __init__(
        self,
        run_dir: str | Path | None = None,
        *,
        device: Any = None,
        log_every: int = 50,
        sinks: Sequence[Any] = ("jsonl",),
        warmup_steps: int = 5,
        flops_per_step: float | None = None,
        precision: str = "fp32",
        config: dict[str, Any] | None = None,
        command: list[str] | None = None,
        total_steps: int | None = None,
        system_sampler: bool = True,
        rank: int = 0,
        kind: str = "train",
        write_env: bool = True,
        reduce_losses: Any = None,
        profile_steps: str | tuple[int, int] | None = None,
        keep_loss_tensors: bool = False,
    ) -> None:
        if log_every < 1:
            raise ConfigError(f"logging.every must be >= 1, got {log_every}")
        if warmup_steps < 0:
            raise ConfigError(f"logging.warmup_steps must be >= 0, got {warmup_steps}")
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.device = device
        self.log_every = log_every
        self.warmup_steps = warmup_steps
        self.flops_per_step = flops_per_step
        self.precision = precision
        self.rank = rank
        self.kind = kind
        # Data parallel: a callable (float64 array -> array) averaging the interval's losses
        # over ranks. Called at the log interval only, on every rank at the same step.
        self.reduce_losses = reduce_losses
        self._failing = False
        self.total_steps = total_steps
        self.steps_done = 0
        self._closed = False

        self._timeline: CpuTimeline | CudaTimeline = (
            CudaTimeline(device) if _is_cuda(device) else CpuTimeline()
        )
        # Closing a step: each timeline keeps its closed steps until flush. On the CPU timeline
        # step() appends the step-end mark itself (one frame fewer per step); otherwise it
        # calls end_step.
        self._end_step = self._timeline.end_step
        self._cpu_marks = self._timeline.marks.append if isinstance(self._timeline, CpuTimeline) else None
        # `mark((time.perf_counter(), code))`: one phase transition, codes from phase_codes().
        # The CPU timeline's own list append (no Python frame), else a route through
        # begin/end. For loops written for speed, like the Trainer's: see hook_phases.
        self.mark = self._cpu_marks or self._mark_via_hooks
        self._cap = min(log_every, _MAX_PENDING)
        # One tuple per pending step (samples, tokens, pad, lr, syncs so far, warmup, t_end,
        # cpu_end, loss; cpu_end None between readings of the CPU clock; loss a float, a kept
        # tensor, _ON_DEVICE or None): building one tuple is the cheapest record on the training
        # thread. Whatever can wait (each step's own sync count, its warm-up flag from
        # mark_warmup and warmup_steps) is worked out at flush: step() runs right after the
        # optimizer's ops, where each bytecode runs with cold caches (see MarkPhase).
        self._rows: list[tuple] = []
        # Process CPU seconds at the end of the step before the pending ones (the first step's
        # CPU time is counted from the Monitor's creation, as its wall time is).
        self._cpu_before = _process_time()
        self._cpu_read_after = 0.0  # perf_counter time from which a step's end reads the CPU clock
        self._cpu_every = CPU_READ_EVERY_S  # per instance: monitor_overhead's side sets 0 (every step)
        self._loss_dev: Any = None  # lazily allocated on the loss's device: slot i is pending step i
        # Non-finite losses seen so far, counted when losses are read back at the log interval
        # (the Trainer's nan_policy=stop reads this instead of checking every step).
        self.nonfinite_losses = 0
        self._syncs = 0  # host syncs counted so far (count_sync); a row holds the total at its end
        self._syncs_before = 0  # the total at the end of the step before the pending ones
        self._warm_marked: set[int] = set()  # pending steps (0-based) that mark_warmup excluded
        # The class of the last loss found to be a CPU scalar tensor; reset at every flush, so a
        # loss that moves to a GPU or grows a dimension is re-examined within one interval.
        self._item_class: Any = None
        # The loop promises that the CPU loss tensors it passes outside autograd are new each
        # step and never changed in place afterwards (the Trainer's are): step() keeps them
        # and flush() reads them, a torch call less per step. Without that promise a later
        # in-place change (`acc.zero_()` on a reused accumulator) would rewrite the record.
        self._keep_losses = keep_loss_tensors
        # `mon.phase(name)` is this table's lookup, a C call (see PhaseTable and phase()).
        context = MarkPhase if isinstance(self._timeline, CpuTimeline) else Phase
        self._phase_ctx = PhaseTable({name: context(self, name) for name in MEASURED_PHASES})
        self.phase = self._phase_ctx.__getitem__  # type: ignore[method-assign]
        # Loaders handed to loader() (ids, bounded): each one's settings are recorded once.
        self._loaders_seen: set[int] = set()
        # The most recent records, for an in-memory summary when there is no run directory
        # (filled on the writer thread: read through `recent`).
        self._recent: deque[dict[str, Any]] = deque(maxlen=4096)

        if self.run_dir is not None:  # a full or read-only disk is said once, and training goes on
            rundir.try_write(self.run_dir, self.run_dir.mkdir, 0o777, True, True)
        self.writer = make_writer(self.run_dir, sinks, config, self.total_steps)
        self._sampler = make_sampler(system_sampler, self.device, self.kind)
        self._start_run(config, command, write_env)
        self._profile = make_profile_window(self, profile_steps)

    # ---------------------------------------------------------------- setup
    def _start_run(self, config, command, write_env) -> None:
        if self.run_dir is not None and self.rank == 0:
            if config is not None or command is not None:
                rundir.try_write(self.run_dir, rundir.write_config, self.run_dir,
                                 config if config is not None else {"command": command})
            if write_env:
                rundir.try_write(self.run_dir, rundir.write_env, self.run_dir)
        self.event(
            "run_start",
            kind=self.kind,
            device=str(self.device or "cpu"),
            precision=self.precision,
            flops_per_step=self.flops_per_step,
            log_every=self.log_every,
            warmup_steps=self.warmup_steps,
            pid=os.getpid(),
            rank=self.rank,
            # The process's command: what a verify command re-runs for a script's own Monitor loop
            argv=list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]),
            cwd=os.getcwd(),
        )

    # ---------------------------------------------------------------- phases
    def begin(self, name: str) -> None:
        """Enter a phase. Time until the next transition is charged to it."""
        idx = PHASE_INDEX.get(name)
        if idx is None or idx == OTHER:
            raise unknown_phase(name)
        self._timeline.begin(idx)

    def end(self, name: str) -> None:
        """Leave a phase; the enclosing phase (or "other") becomes active again. Unbalanced
        hooks (an exception between begin and end) unwind to `name`."""
        idx = PHASE_INDEX.get(name)
        if idx is not None and idx != OTHER:
            self._timeline.end(idx)

    def hook_phases(self, on: bool) -> None:
        """Route every phase transition (`with mon.phase`, `mon.mark`) through begin/end, which
        a profiler window shadows on this instance while it is open; or stop doing so."""
        self.mark = self._mark_via_hooks if on or self._cpu_marks is None else self._cpu_marks
        for ctx in self._phase_ctx.values():
            if isinstance(ctx, MarkPhase):
                ctx.__class__ = HookedMarkPhase if on else MarkPhase

    def _mark_via_hooks(self, mark: tuple[float, int]) -> None:
        code = mark[1]
        if code >= 0:
            self.begin(PHASES[code])
        else:
            self.end(PHASES[-2 - code])

    def phase(self, name: str) -> Phase | MarkPhase:
        """`with mon.phase("forward"):` — one reusable context object per name, valid for the
        Monitor's lifetime, so a loop may fetch it once and keep it. An unknown name raises
        ConfigError. Each instance replaces this method with its PhaseTable's lookup, a C
        call: this runs ~3 times a step, right after torch ops, where every Python frame
        costs microseconds."""
        return self._phase_ctx[name]

    def loader(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Wrap a data iterable: the time spent waiting in `next()` is the "data" phase. A
        DataLoader's settings are recorded once (the first is the training loader), so the
        findings at close name its num_workers, not "no DataLoader"."""
        observe_loader(self, iterable, self._loaders_seen)
        iterator = iter(iterable)
        if not isinstance(self._timeline, CpuTimeline):
            data = self.phase("data")
            while True:
                with data:
                    try:
                        batch = next(iterator)
                    except StopIteration:
                        return
                yield batch
        # CPU: `with self.phase("data")` written out as its two marks; this runs once a step,
        # right after the optimizer's last op (see MarkPhase for why calls cost there).
        # self.mark is the timeline's list append (a C call), or the route through begin/end
        # while a profiler window is open (hook_phases): looked up at each mark.
        begin, end = PHASE_INDEX["data"], end_code(PHASE_INDEX["data"])
        while True:
            self.mark((_perf_counter(), begin))
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                self.mark((_perf_counter(), end))
            yield batch

    def count_sync(self, n: int = 1) -> None:
        """Count host-device synchronizations seen in the current step."""
        self._syncs += n

    def mark_warmup(self) -> None:
        """Exclude the current step from throughput (warm-up, compilation)."""
        self._warm_marked.add(self.steps_done)

    def set_flops_per_step(self, flops: float, per_token: float | None = None) -> None:
        """FLOPs of one optimizer step, for MFU. `per_token`, when the count is per real token
        (variable-length batches): the report then uses it with each step's own tokens."""
        self.flops_per_step = float(flops)
        extra = {"flops_per_token": float(per_token)} if per_token else {}
        self.event("flops", flops_per_step=self.flops_per_step, **extra)

    # ---------------------------------------------------------------- steps
    def step(
        self,
        *,
        samples: int = 0,
        tokens: int = 0,
        pad_tokens: int = 0,
        loss: Any = None,
        lr: float | None = None,
        warmup: bool = False,
    ) -> None:
        """Close the current step. `loss` may be a device tensor: it is copied into a device
        buffer (no sync) and read back at the log interval."""
        rows = self._rows
        cpu_marks = self._cpu_marks
        if cpu_marks is not None:  # CpuTimeline.end_step written out
            t_end = _perf_counter()
            cpu_marks((t_end, STEP_END))
            self._timeline._since_step = 0  # type: ignore[union-attr]
        else:
            t_end = self._end_step()
        # The step's end on the host clock becomes its wall time at flush (one time.time()
        # per interval instead of one per step); the CPU clock, see CPU_READ_EVERY_S.
        if t_end >= self._cpu_read_after:
            cpu = _process_time()
            self._cpu_read_after = t_end + self._cpu_every
        else:
            cpu = None
        if loss is not None:
            if loss.__class__ is not self._item_class:
                loss = self._store_loss(len(rows), loss)
            elif not self._keep_losses or loss.requires_grad:
                # A CPU scalar, as the last checked loss was (rechecked every interval). Each torch
                # call costs microseconds right after the optimizer's ops (item() ~10 µs a step in
                # monitor_overhead's loop), so is_cpu/numel are not asked, and with
                # keep_loss_tensors a loss outside autograd is kept as it is (the row holds it)
                # and read at flush. One still in a graph is read now: holding it would hold its graph.
                try:
                    loss = loss.item()
                except RuntimeError:  # not one element any more: a per-sample loss vector
                    loss = self._store_loss(len(rows), loss)
        rows.append((samples, tokens, pad_tokens, lr, self._syncs, warmup, t_end, cpu, loss))
        self.steps_done += 1
        if len(rows) >= self._cap:
            self.flush()
        if self._profile is not None:
            self._profile.after_step(self.steps_done)

    def _store_loss(self, i: int, loss: Any) -> Any:
        """A loss not yet known to be a CPU scalar tensor (step() reads those itself), as pending
        step i's row holds it: a float, or _ON_DEVICE (copied into the device buffer's slot i)."""
        if isinstance(loss, (int, float)):
            return float(loss)
        if loss.is_cpu and loss.numel() == 1:
            self._item_class = loss.__class__  # step() reads the next ones directly
            return loss.item()
        self._item_class = None
        if loss.is_cpu:
            return float(loss.detach().float().mean())
        value = loss.detach()
        if value.numel() != 1:
            value = value.float().mean()
        elif value.dim():
            value = value.reshape(())
        if self._loss_dev is None or self._loss_dev.device != value.device:
            import torch

            self._loss_dev = torch.zeros(self._cap, dtype=torch.float32, device=value.device)
        self._loss_dev[i].copy_(value)  # async on CUDA: no host sync
        return _ON_DEVICE

    def flush(self) -> None:
        """Resolve pending steps into records and hand them to the writer."""
        n = len(self._rows)
        if n == 0:
            return
        if self._rows[-1][7] is None:  # the interval's last steps end at a reading
            self._rows[-1] = (*self._rows[-1][:7], _process_time(), self._rows[-1][8])
        first = self.steps_done - n  # the 0-based index of the first pending step
        kept = [r[8] for r in self._rows]  # floats, tensors step() kept, _ON_DEVICE or None
        if any(x is _ON_DEVICE for x in kept):
            # Deliberate sync point, once per log interval: read the losses back.
            device_losses = self._loss_dev[:n].tolist()
            kept = [device_losses[i] if x is _ON_DEVICE else x for i, x in enumerate(kept)]
        given = [x is not None for x in kept]
        loss_list = [math.nan if x is None else x if x.__class__ is float else _host_loss(x) for x in kept]
        if self.reduce_losses is not None and not self._failing:
            # A collective: skipped when closing on an error (the other ranks may be gone).
            loss_list = np.asarray(self.reduce_losses(np.asarray(loss_list, dtype=np.float64)),
                                   dtype=np.float64).tolist()
        self.nonfinite_losses += sum(1 for x, g in zip(loss_list, given) if g and not math.isfinite(x))
        # The timeline is consumed only after the loss reduction, a collective that can fail
        # (a dead rank): close() then flushes again, with every pending step still in place.
        rows = pending_rows(self._rows, first, self._syncs_before, self._warm_marked, self.warmup_steps)
        self._item_class = None
        wall_offset = time.time() - _perf_counter()  # rows hold perf_counter times
        build = partial(_interval_records, rows, loss_list, self._recent, first_step=first,
                        wall_offset=wall_offset, rank=self.rank, cpu_before=self._cpu_before)
        timeline = self._timeline
        if isinstance(timeline, CpuTimeline):
            # Resolving the marks and building the records is ~0.6 ms of Python per 50 steps
            # (12 µs a step): the writer thread does it, in order, from the marks taken here.
            taken = timeline.take_closed()
            self.writer.submit_built(n, partial(build, partial(timeline.resolve_marks, taken), self._sampler, None))
        else:  # CUDA events and allocator counters are read here, on the training thread
            self.writer.submit_steps(build(timeline.resolve, self._sampler, self.device))
        self._cpu_before = rows[-1][7]
        self._syncs_before = self._rows[-1][4]
        self._warm_marked = {i for i in self._warm_marked if i >= self.steps_done}
        self._rows = []

    @property
    def recent(self) -> deque[dict[str, Any]]:
        """The step records flushed so far (the last 4096), once the writer thread has built
        them: this waits for it, so read it at the end or now and then, not every step."""
        self.writer.flush()
        return self._recent

    # ---------------------------------------------------------------- events
    def event(self, type_: str, *, step: int | None = None, **data: Any) -> None:
        """Record an event at `step`, by default the number of steps recorded so far. Within a
        step, before step() closes it, that number is the step before: work that belongs to
        the step being run (the Trainer's evaluations) passes that step."""
        record = schema.make_event(type_, self.steps_done if step is None else step, time.time(), **data)
        record["rank"] = self.rank
        self.writer.submit_event(record)

    # ---------------------------------------------------------------- close
    def close(
        self,
        *,
        findings: list[dict[str, Any]] | None = None,
        error: BaseException | None = None,
    ) -> dict[str, Any]:
        """Flush, stop the writer and sampler, write report.json with the run's findings (those
        given, else diagnosed from the run directory; telemetry/diagnosis.py); return the summary."""
        if self._closed:
            return self._summary
        self._closed = True
        self._failing = error is not None
        if self._profile is not None:
            self._profile.finish()  # a run that ends inside the window still gets its trace
        self.flush()
        trace = None
        if error is not None:
            # a crash (with its traceback), or Ctrl-C / SIGTERM: an interrupt, not a crash
            type_, data = schema.ending_event(error)
            trace = data.get("traceback")
            self.event(type_, **data)
        if self._sampler is not None:
            self._sampler.stop()
            # The sampled series (bounded by the sampler's ring) goes with the summary: the
            # checks line it up with the steps by t_wall (other processes' CPU per step).
            self.event("system", **self._sampler.summary(), series=self._sampler.series())
        self.event("run_end", steps=self.steps_done)
        self.writer.close()
        run, self._summary = self._summarize()
        if self.run_dir is not None and self.rank == 0:
            from trainspeed.telemetry.diagnosis import end_of_run_report
            # the findings of the run directory: as given, else the rules' (telemetry/diagnosis.py)
            rundir.try_write(self.run_dir, rundir.write_json, self.run_dir / schema.REPORT_JSON,
                             end_of_run_report(run, self._summary, kind=self.kind, given=findings, traceback=trace))
        return self._summary

    def _summarize(self) -> tuple[Any, dict[str, Any]]:
        """(the run as read back, its summary)."""
        from trainspeed.telemetry.rundir import RunData, read_run
        from trainspeed.telemetry.summary import summarize

        run = None
        if self.run_dir is not None and (self.run_dir / schema.STEPS_FILE).exists():
            try:
                run = read_run(self.run_dir)
            except OSError:  # removed or unreadable under us: the records kept in memory
                run = None
        if run is None:
            run = RunData(path=self.run_dir or Path("."), steps=list(self._recent))
            run.events = [schema.make_event("run_start", 0, 0.0, flops_per_step=self.flops_per_step,
                                            device=str(self.device or "cpu"),
                                            precision=self.precision)]
        return run, summarize(run)

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(error=exc if exc_type is not None and exc_type is not GeneratorExit else None)


def _interval_records(rows: list[tuple], losses: list[float], recent: deque, resolve: Any, sampler: Any,
                      cuda_device: Any, **where: Any) -> list[dict[str, Any]]:
    """One log interval's step records, kept in `recent` too: its steps' phase times (`resolve()`:
    a CPU timeline's marks resolved on the writer thread, or a CUDA timeline's events), rows,
    losses and memory (the sampler's latest reading; allocator counters on CUDA)."""
    from trainspeed.telemetry.memory import interval_memory

    mem = interval_memory(cuda_device, sampler.latest() if sampler is not None else {})
    records = step_records(resolve(), rows, losses, mem=mem, **where)
    recent.extend(records)
    return records


def _host_loss(loss: Any) -> float:
    """A loss tensor kept by step() as a Python float: its value, or its mean if it turned out
    to be a per-sample vector."""
    try:
        return loss.item()
    except RuntimeError:
        return float(loss.detach().float().mean())
