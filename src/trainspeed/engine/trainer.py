"""`Trainer`: the training loop, every speed technique one config switch away.

    trainer = Trainer(model, loss_fn, train_data, val_data, config="fast.yaml")
    summary = trainer.fit()

`loss_fn(model, batch) -> loss` (a scalar mean over the batch; or `(loss, metrics_dict)`).
The loop below reads top to bottom: fetch k micro-batches (data), copy (h2d), forward,
backward, optimizer step, then evaluation and checkpoints at their intervals. Setup lives
in setup.py; each switch is a plain function in its own module.
"""

from __future__ import annotations

import dataclasses
import time
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from trainspeed.config import TrainConfig, config_to_dict, load_config
from trainspeed.engine.accumulation import micro_batch_weights
from trainspeed.engine.data.prefetch import move_to_device
from trainspeed.engine.data.stats import batch_stats as default_batch_stats
from trainspeed.engine.evaluation import evaluate
from trainspeed.engine.events import Callback, CallbackList, Event, TrainerState
from trainspeed.engine.loss_shape import raise_if_not_scalar
from trainspeed.engine.microbatch import MicroBatcher, auto_microbatch_enabled, free_after_oom, is_oom
from trainspeed.engine.nonfinite import NonFiniteGuard, NonFiniteLossError  # noqa: F401 - re-exported
from trainspeed.engine.observations import emit_observations
from trainspeed.engine.schedule import build_loop_scheduler, loop_length, steps_per_epoch
from trainspeed.engine.setup import (
    DataParts, build_loaders, prepare_model, resolve_device, run_dir_for, seed_everything,
    set_threads,
)
from trainspeed.engine.run_folders import new_folders
from trainspeed.engine.trainer_checkpoints import check_resume, checkpoint_session, state_fn
from trainspeed.errors import ConfigError
from trainspeed.telemetry.phase_context import phase_codes

# Phase transition codes for Monitor.mark (see _train_step).
_clock = time.perf_counter
_H2D, _H2D_END = phase_codes("h2d")
_FORWARD, _FORWARD_END = phase_codes("forward")
_BACKWARD, _BACKWARD_END = phase_codes("backward")
_OPTIMIZER, _OPTIMIZER_END = phase_codes("optimizer")
_DATA, _DATA_END = phase_codes("data")
_END = object()  # next(iterator, _END): the epoch's batches ran out


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[nn.Module, Any], Any],
        train_data: Any,
        val_data: Any = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        config: TrainConfig | dict | str | None = None,
        callbacks: Sequence[Callback] = (),
        collate_fn: Callable | None = None,
        batch_stats: Callable[[Any], Any] | None = None,
        lengths: Sequence[int] | None = None,
        eval_metrics: Callable[[nn.Module, Iterable], dict] | None = None,
        scheduler: Any = None,
        flops_per_token: float | None = None,
    ) -> None:
        from trainspeed.engine.optim import build_optimizer, describe_optimizer
        from trainspeed.engine.precision import setup_precision

        self.cfg = config if isinstance(config, TrainConfig) else load_config(config)
        self._resume_target = check_resume(self.cfg)  # before anything is built or written
        set_threads(self.cfg)
        seed_everything(self.cfg.run.seed)
        from trainspeed.engine.distributed import setup_distributed, wrap_model

        self.dist, self.device = setup_distributed(self.cfg, resolve_device(self.cfg.run.device))
        self.rank, self.world_size = self.dist.rank, self.dist.world_size
        parts = prepare_model(model, self.cfg, self.device)
        self.model, wrap_notes = wrap_model(parts.model, parts.eager, self.dist, self.device)
        self.eager = parts.eager
        self.notes = list(parts.notes) + self.dist.notes + wrap_notes
        if optimizer is not None and self.dist.fsdp:
            raise ConfigError("distributed.strategy=fsdp replaces the parameters by sharded ones, "
                              "so an optimizer built beforehand would update stale tensors. Pass "
                              "optimizer=None (configure it under optim.*).")
        self.compiled = parts.compiled
        self.loss_fn = loss_fn
        # Under DeepSpeed its engine runs bf16/fp16 (deepspeed_config.py): no autocast of ours.
        self.precision = setup_precision(
            dataclasses.replace(self.cfg.precision, mode="fp32") if self.dist.deepspeed else self.cfg.precision,
            self.device)
        self.notes += list(getattr(self.precision, "notes", []) or [])
        if optimizer is None:
            optimizer, info = build_optimizer(self.eager, self.cfg.optim, self.device)
            self.notes.append(describe_optimizer(info))
        self.optimizer = optimizer
        self._ds: Any = None  # DeepSpeed's engine (distributed.strategy=deepspeed)
        self._ds_step: Any = None  # its step (deepspeed_engine.train_step), bound once
        if self.dist.deepspeed:
            from trainspeed.engine.deepspeed_engine import start_engine, train_step

            self._ds, self.ds_config, ds_notes = start_engine(self.eager, optimizer, self.cfg, self.device,
                                                              self.world_size)
            self._ds_step = train_step
            self.model = self._ds
            self.notes += ds_notes
        if self.dist.sharded_saves:
            from trainspeed.engine.checkpoint.sharded import temp_tag
            from trainspeed.engine.distributed import FsdpState

            if self.dist.fsdp:
                self._fsdp_state = FsdpState(self.eager, optimizer)  # loads single-file checkpoints
            # Own gloo groups: DCP's async save runs collectives from a background thread, and
            # the save agreements must not queue behind them.
            self._ckpt_group = self.dist.new_cpu_group("checkpoint group creation")
            self._agree_group = self.dist.new_cpu_group("agreement group creation")
            # rank 0's pid names the temp directories, so it alone can tell a stale one
            self._ckpt_tag = self.dist.broadcast_object(temp_tag(), "checkpoint tag broadcast")
        self.scheduler = scheduler
        self.data = DataParts(train=train_data, val=val_data, collate_fn=collate_fn,
                              batch_stats=batch_stats, lengths=lengths)
        self.eval_metrics = eval_metrics
        self.flops_per_token = flops_per_token
        self.callbacks = CallbackList(callbacks)
        self.state = TrainerState(trainer=self)
        quiet = None if self.rank == 0 else (lambda text: None)  # rank 0 names the run (stamps differ), says which
        self.run_dir = Path(self.dist.broadcast_object(str(run_dir_for(self.cfg, quiet)), "run name broadcast"))
        self.monitor: Any = None
        self._flops_done = False
        self._lr_static = False  # set in fit() when our own schedule is a constant lr
        self._plain_pass = False  # set in fit(): see _train_step
        self._plain_update = False  # likewise
        self._fallback_reported = False
        self.auto_microbatch = auto_microbatch_enabled(self.cfg.batch.auto_microbatch, self.world_size)
        # Training on the CPU: loader batches are already where the model is, so the per-batch
        # copy (a walk over the batch calling Tensor.to) is skipped, and h2d stays at zero.
        self._copy_batches = self.device.type != "cpu"
        self._has_no_sync = hasattr(self.model, "no_sync")
        self._fsdp = self.dist.fsdp
        self.nan_guard = NonFiniteGuard(self.cfg.nan_policy, self.cfg.logging.every,
                                        self.callbacks, self.state)
        self.microbatcher = MicroBatcher()  # split 1 until an out-of-memory step (auto_microbatch)

    # ------------------------------------------------------------------ fit
    def fit(self) -> dict[str, Any]:
        """Train until run.max_steps (or run.max_epochs); return the run summary."""
        from trainspeed.engine.distributed import clear_error, rank_run_dir
        from trainspeed.telemetry.monitor import Monitor

        cfg = self.cfg
        loaders = build_loaders(self.data, cfg, self.device, self.rank, self.world_size)
        total = loop_length(loaders.train, cfg.run, cfg.accumulation.steps)
        if self.scheduler is None:
            # a constant lr is never stepped; checkpoints still record the step (see trainer_checkpoints.state_fn)
            self.scheduler, self._lr_static = build_loop_scheduler(self.optimizer, cfg.optim, total)
        sinks = tuple(cfg.logging.sinks) + (("console",) if cfg.logging.progress and "console" not in cfg.logging.sinks else ())
        made = new_folders(rank_run_dir(self.run_dir, self.rank), cfg.checkpoint.dir)  # taken back if the resume fails
        self.monitor = mon = Monitor(
            rank_run_dir(self.run_dir, self.rank), device=self.device, log_every=cfg.logging.every,
            sinks=sinks if self.rank == 0 else ("jsonl",),  # ranks > 0: their own step records only
            warmup_steps=cfg.logging.warmup_steps, precision=cfg.precision.mode,
            config=config_to_dict(cfg), total_steps=total, rank=self.rank,
            reduce_losses=self.dist.loss_reducer(self.device),
            profile_steps=cfg.profile.steps,  # a torch.profiler trace of those steps (telemetry/profiling.py)
            keep_loss_tensors=True,  # the step's loss is a new detached tensor, never changed after
        )
        for note in self.notes + loaders.notes:
            mon.event("note", message=note)
        # The loaders and device as the checks read them: findings at the run's end (written by
        # Monitor.close) then name the engine's settings (observations.py).
        emit_observations(mon, loaders, self.data, cfg, self.device, self.eager, self._ds)
        self._record_peak(mon)
        # Seed right before the loop: setup above (peak measurement, loader creation) must not
        # shift the random stream that dropout and augmentation see. A resume then restores
        # the checkpoint's RNG states on top.
        seed_everything(cfg.run.seed)
        # The written-out single-batch pass in _train_step applies (see _piece_step for the rest).
        self._plain_pass = (not self._copy_batches and self.precision.dtype is None and self.precision.scaler is None
                            and not {Event.AFTER_FORWARD, Event.AFTER_BACKWARD} & self.callbacks.listening)
        # The optimizer phase is step, zero_grad (and the schedule) alone: see _train_step.
        self._plain_update = (not self.nan_guard.per_step and not cfg.optim.grad_clip
                              and self.precision.scaler is None)
        ckpt = self._ckpt_session = checkpoint_session(self, mon, loaders, made)
        make_state = state_fn(self, loaders)
        try:
            with ckpt:
                self._loop(loaders, mon, total, ckpt, make_state)
                ckpt.finish(self.state.step, make_state, self.state.metrics)
        except BaseException as exc:
            clear = clear_error(self.dist, exc)  # a failed collective: say which rank and why
            ckpt.crash(exc, self.state.step, make_state)
            mon.close(error=clear or exc)
            if clear is not None:
                raise clear from exc
            raise
        if self.dist.active:  # host time in the collectives issued outside forward/backward
            mon.event("collectives", ops=self.dist.collective_summary(),
                      note="host seconds per kind of collective issued by trainspeed; DDP's, "
                           "FSDP's and DeepSpeed's own collectives overlap forward/backward and count there")
        summary = self.dist.close_monitor(mon)
        self.dist.teardown()
        return summary

    def _loop(self, loaders, mon, total_steps: int, ckpt, make_state) -> None:
        cfg, st, fire = self.cfg, self.state, self.callbacks.fire
        k = cfg.accumulation.steps
        stats_fn = self.data.batch_stats or default_batch_stats
        # The sampler's own advance(), counted in batches (bucketed) or samples: no adapter
        # frame between it and the loop.
        advance, by_batches = loaders.train_bundle.advancer() if loaders.train_bundle is not None else (None, False)
        eval_every = (cfg.eval.every_steps or 0) if self.data.val is not None else 0
        # Checkpoint work at a step boundary: periodic saves or a signal agreement every step;
        # otherwise only once a signal arrived (step_end is two calls, skipped when idle).
        ckpt_every_step, emergency = ckpt.every_step, ckpt.emergency
        self.model.train()
        fire(Event.FIT_START, st)
        per_epoch = steps_per_epoch(loaders.train, k)
        while st.step < total_steps and not st.should_stop:
            self._set_epoch(loaders.train_sampler, st.epoch)
            # The next step pays the epoch's start (new iterator, workers restarted unless
            # persistent): the tuner amortizes it over per_epoch steps.
            mon.event("epoch", epoch=st.epoch, steps_per_epoch=per_epoch, batch_in_epoch=st.batch_in_epoch)
            fire(Event.EPOCH_START, st)
            source, prefetcher = self._epoch_source(loaders.train, stats_fn)
            exhausted = False
            while True:
                # Fetch the step's k micro-batches, each wait timed as "data". Written out here
                # rather than as generators (Monitor.loader inside a grouping generator): each
                # generator resume costs microseconds right after the previous step's ops.
                # Stats are taken on the host batch (before any copy), so they never sync.
                mark = mon.mark  # see _train_step
                group: list[tuple[Any, Any]] = []
                while True:
                    mark((_clock(), _DATA))
                    try:
                        batch = next(source, _END)
                    finally:
                        mark((_clock(), _DATA_END))
                    if batch is _END:
                        exhausted = True
                        break
                    group.append((batch, stats_fn(batch) if prefetcher is None else prefetcher.last_stats))
                    if len(group) == k:
                        break
                if not group:
                    break
                # The handlers of callbacks that override the event, called here (no fire()
                # frame); read per step: a callback may add callbacks.
                handlers = self.callbacks.handlers
                for handler in handlers[Event.BATCH_START]:
                    handler(st)
                loss = self._train_step(group, mon)
                if len(group) == 1:
                    stats = group[0][1]
                    samples, tokens, pad_tokens = stats.samples, stats.tokens, stats.pad_tokens
                else:
                    samples, tokens, pad_tokens = (sum(s.samples for _, s in group), sum(s.tokens for _, s in group),
                                                   sum(s.pad_tokens for _, s in group))
                st.step += 1
                st.batch_in_epoch += len(group)
                st.samples += samples
                st.tokens += tokens
                if advance is not None:  # what was trained, not what was prefetched
                    advance(len(group) if by_batches else samples)
                st.loss, st.lr = loss, self.optimizer.param_groups[0]["lr"]
                for handler in handlers[Event.BATCH_END]:
                    handler(st)
                # Interval work (eval, checkpoints) belongs to the step that triggers it, so the
                # step record shows its cost: close the Monitor's step only after it.
                if eval_every and st.step % eval_every == 0:
                    evaluate(self, loaders.val, mon)
                if ckpt_every_step or emergency.signum is not None:
                    # periodic save, or a signal's save (the exit waits for the step's record)
                    ckpt.step_end(st.step, make_state, st.metrics, defer_exit=True)
                mon.step(samples=samples, tokens=tokens, pad_tokens=pad_tokens, loss=loss, lr=st.lr)
                if ckpt.stopping is not None:
                    ckpt.leave()  # "stopped at step N; checkpoint saved to ...; resume with ..."
                if mon.nonfinite_losses != self.nan_guard.seen:  # read back at the log interval
                    self.nan_guard.check(mon)
                if exhausted or st.step >= total_steps or st.should_stop:
                    break
            if st.step >= total_steps or st.should_stop:
                break
            # the epoch ran out of batches
            fire(Event.EPOCH_END, st)
            st.epoch += 1
            st.batch_in_epoch = 0
        if cfg.eval.at_end and loaders.val is not None and st.metrics.get("_at_step") != st.step:
            evaluate(self, loaders.val, mon)
        fire(Event.FIT_END, st)

    def _train_step(self, group: list[tuple[Any, Any]], mon) -> torch.Tensor:
        """Forward, backward and optimizer step over the step's (batch, stats) micro-batches;
        returns the step's loss, still on the device."""
        cfg, st = self.cfg, self.state
        # Phases are written as mark/try/finally/mark, not `with mon.phase(...)`: the marks are
        # the same, but a `with` block's Python __enter__/__exit__ cost ~25 µs a step more for
        # three phases, right after torch ops (see Monitor.mark). Read once per step: a
        # profiler window re-routes it between steps.
        mark = mon.mark
        first_step = not self._flops_done
        t0 = 0.0
        if first_step:
            self._flops_done = True
            self._record_flops(mon, group[0][0], group[0][1])
            t0 = _clock()
        if self._ds_step is not None:
            return self._ds_step(self, group, mon)
        while True:
            try:
                if self._plain_pass and len(group) == 1 and self.microbatcher.split == 1:
                    # One batch, on the CPU, fp32/tf32, no per-pass listeners: the forward and
                    # backward of _piece_step written out here, since every Python frame costs
                    # microseconds right after the previous step's ops.
                    mark((_clock(), _FORWARD))
                    try:
                        loss = self.loss_fn(self.model, group[0][0])
                        if isinstance(loss, tuple):
                            loss = loss[0]
                    finally:
                        mark((_clock(), _FORWARD_END))
                    mark((_clock(), _BACKWARD))
                    try:
                        loss.backward()
                    except RuntimeError as exc:
                        raise_if_not_scalar(loss, exc)
                        raise
                    finally:
                        mark((_clock(), _BACKWARD_END))
                    total_loss = loss.detach()
                else:
                    batches, stats = [b for b, _ in group], [s for _, s in group]
                    weights = micro_batch_weights([s.tokens for s in stats], cfg.accumulation.normalize) \
                        if len(group) > 1 else [1.0]
                    total_loss = self._forward_backward(batches, weights, mon)
                break
            except Exception as exc:
                if not self.auto_microbatch or not is_oom(exc):
                    raise
                info = self.microbatcher.grow([b for b, _ in group], exc)
            # Out of the except block, the traceback and the activations its frames held are
            # gone, so the cache can really be emptied before the same step runs again.
            free_after_oom(self.eager, self.optimizer, self.device)
            mon.event("auto_microbatch", at_step=st.step + 1, **info)
        mark((_clock(), _OPTIMIZER))
        try:
            if self._plain_update:  # no skip check, clipping or loss scaling (set in fit)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                if not self._lr_static:
                    self.scheduler.step()
            elif self.nan_guard.per_step and self.nan_guard.should_skip(total_loss, mon):
                self.optimizer.zero_grad(set_to_none=True)
            else:
                if cfg.optim.grad_clip:
                    self.precision.unscale_(self.optimizer)
                    torch.nn.utils.clip_grad_norm_(self.eager.parameters(), cfg.optim.grad_clip)
                if self.precision.scaler is None:
                    self.optimizer.step()
                else:
                    self.precision.step(self.optimizer)
                self.optimizer.zero_grad(set_to_none=True)
                if not self._lr_static:
                    self.scheduler.step()
            for handler in self.callbacks.handlers[Event.OPTIMIZER_STEP]:  # see _loop
                handler(st)
        finally:
            mark((_clock(), _OPTIMIZER_END))
        if self.compiled:
            self._report_compile(mon, first_step, t0)
        return total_loss

    def _report_compile(self, mon, first_step: bool, t0: float) -> None:
        """The first compiled step (compilation) leaves throughput; a fallback to eager is
        reported once."""
        if first_step:
            mon.mark_warmup()
            mon.event("compile", mode=self.cfg.compile.mode, first_step_s=_clock() - t0)
        if not self._fallback_reported:
            reason = getattr(self.model, "fallback_reason", None)
            if reason:
                self._fallback_reported = True
                mon.event("warning", message=f"torch.compile failed; running eager: {reason}")

    def _forward_backward(self, batches: list[Any], weights: Sequence[float], mon) -> torch.Tensor:
        """Forward and backward over the step's micro-batches (each cut into pieces after an
        out-of-memory step, see microbatch.py); returns the step's loss, still on the device."""
        cfg = self.cfg
        if self.microbatcher.split == 1:
            pieces = list(zip(batches, weights))
        else:
            pieces = [(p.batch, p.weight) for p in self.microbatcher.pieces(
                batches, weights, cfg.accumulation.normalize, self.data.batch_stats or default_batch_stats)]
        total_loss: torch.Tensor | None = None
        mark = mon.mark  # see _train_step
        for i, (batch, weight) in enumerate(pieces):
            if self._copy_batches:
                mark((_clock(), _H2D))
                try:
                    batch = move_to_device(batch, self.device, cfg.data.non_blocking)
                finally:
                    mark((_clock(), _H2D_END))
            last = i == len(pieces) - 1
            if self._fsdp and len(pieces) > 1:
                self.eager.set_requires_gradient_sync(last)
            if not last and self._has_no_sync:
                # DDP: skip the gradient all-reduce on all but the last micro-batch. FSDP2 skips
                # the reduce-scatter likewise (above: gradients accumulate unsharded).
                with self.model.no_sync():
                    loss = self._piece_step(batch, weight, mon)
            else:
                loss = self._piece_step(batch, weight, mon)
            part = loss.detach() if weight == 1.0 else loss.detach() * weight
            total_loss = part if total_loss is None else total_loss + part
        return typing.cast(torch.Tensor, total_loss)  # _loop never trains an empty group

    def _piece_step(self, batch: Any, weight: float, mon) -> torch.Tensor:
        """Forward and backward of one micro-batch. fp32/tf32 runs skip the autocast region and
        the loss-scaling call: both are no-ops there, and each costs calls every step."""
        prec, listening, st = self.precision, self.callbacks.listening, self.state
        mark = mon.mark  # see _train_step
        mark((_clock(), _FORWARD))
        try:
            if prec.dtype is None:
                loss = self._loss(self.model, batch)
            else:
                with prec.autocast():
                    loss = self._loss(self.model, batch)
        finally:
            mark((_clock(), _FORWARD_END))
        if Event.AFTER_FORWARD in listening:
            self.callbacks.fire(Event.AFTER_FORWARD, st)
        mark((_clock(), _BACKWARD))
        try:
            scaled = loss if weight == 1.0 else loss * weight
            if prec.scaler is None:
                scaled.backward()
            else:
                prec.backward(scaled)
        except RuntimeError as exc:
            raise_if_not_scalar(loss, exc)
            raise
        finally:
            mark((_clock(), _BACKWARD_END))
        if Event.AFTER_BACKWARD in listening:
            self.callbacks.fire(Event.AFTER_BACKWARD, st)
        return loss

    # ------------------------------------------------------------------ pieces
    def _loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        out = self.loss_fn(model, batch)
        return out[0] if isinstance(out, tuple) else out

    def _epoch_source(self, loader: Iterable[Any], stats_fn: Callable[[Any], Any]) -> tuple[Iterator[Any], Any]:
        """This epoch's batch iterator, and the device prefetcher behind it (or None)."""
        if self.cfg.data.device_prefetch and self.device.type == "cuda":
            from trainspeed.engine.data.prefetch import DevicePrefetcher

            # Copies batch i+1 on a side stream while batch i trains; stats are taken on the
            # host batch inside the prefetcher, before its copy (its `last_stats`).
            prefetcher = DevicePrefetcher(loader, self.device, non_blocking=self.cfg.data.non_blocking,
                                          stats_fn=stats_fn)
            return iter(prefetcher), prefetcher
        return iter(loader), None

    @staticmethod
    def _set_epoch(sampler: Any, epoch: int) -> None:
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def _record_peak(self, mon) -> None:
        from trainspeed.telemetry.peaks import dtype_for_precision, record_peak

        record_peak(mon, self.device, dtype_for_precision(self.cfg.precision.mode))

    def _record_flops(self, mon, batch: Any, stats: Any) -> None:
        """FLOPs of one optimizer step, for MFU: analytic when the recipe knows them, else
        counted once with FlopCounterMode on the first batch (excluded from timing)."""
        k = self.cfg.accumulation.steps
        if self.flops_per_token and stats.tokens:
            mon.set_flops_per_step(self.flops_per_token * stats.tokens * k, per_token=self.flops_per_token)
            return
        try:
            from trainspeed.telemetry.flops import count_train_step_flops

            on_device = move_to_device(batch, self.device, False)
            if self._ds is not None:
                from trainspeed.engine.deepspeed_engine import forward_flops_x3

                flops = forward_flops_x3(self._ds, self._loss, on_device)
            else:
                flops = count_train_step_flops(self.eager, self._loss, on_device)
            mon.set_flops_per_step(flops * k)
        except Exception as exc:  # noqa: BLE001 - MFU is optional; training is not
            mon.event("warning", message=f"FLOP counting failed, MFU not reported: {exc}")
        mon.mark_warmup()
