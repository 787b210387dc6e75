"""The state every hook family shares while a foreign script runs under the doctor.

One `Session` per doctor run. Hooks call `session.on()` first: it is False in forked DataLoader
workers, in other threads (the Monitor's writer, Lightning's helpers), while the doctor itself
is working (`internal`), and after the run; then the hook is a plain pass-through.

Step boundary = an optimizer step of the *primary* optimizer (the first one that steps), so a
GAN's two optimizers make one step, and gradient accumulation shows up as several backward
calls per step.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Any

import torch

from trainspeed.doctor.instrument.batch import BatchStats
from trainspeed.doctor.instrument.sites import SiteCounter

SAMPLE_FIRST_BATCHES = 8
"""Padding is measured exactly on the first batches, then on every SAMPLE_EVERY-th one
(padding comes from the collate function, so it is stable batch to batch)."""
SAMPLE_EVERY = 8


class StopDoctor(BaseException):
    """Raised from the step hook after the requested number of steps; the runner catches it.
    A BaseException so that a script's `except Exception:` does not swallow it."""


_CURRENT: Session | None = None
_FORK_HOOK_REGISTERED = False


def _disable_in_child() -> None:
    # A forked DataLoader worker inherits the patches; its copy of the session must stay idle
    # (the Monitor's writer thread does not exist there).
    if _CURRENT is not None:
        _CURRENT.enabled = False


class Session:
    """Shared state of one doctor run. See module docstring."""

    def __init__(self, monitor: Any, *, max_steps: int | None, count_flops_at: int | None = None) -> None:
        global _CURRENT, _FORK_HOOK_REGISTERED
        self.mon = monitor
        self.max_steps = max_steps
        self.pid = os.getpid()
        self.thread = threading.get_ident()
        self.enabled = True
        self.internal = 0
        # nesting depths of the outermost hooks
        self.fwd_depth = 0
        self.fwd_phase: str | None = None
        self.bwd_depth = 0
        self.eval_open = False
        self.in_data = False  # inside DataLoader.__next__: the data pipeline's own reads
        self.primary_opt: int | None = None
        # per-step accumulators, reset at each step boundary
        self.step_samples = 0
        self.step_tokens = 0
        self.step_pad = 0
        self.step_loader_batches = 0
        self.step_fwd_samples = 0
        self.step_backwards = 0
        self.batch_ids: set[int] = set()
        self.last_loss: Any = None
        # whole-run aggregates (bounded: keyed by code sites, objects, or small counts)
        self.accumulation: Counter[int] = Counter()
        self.sites = SiteCounter()
        self.observations: dict[str, dict[str, Any]] = {}
        self.loaders: dict[int, dict[str, Any]] = {}
        self.checkpoint_paths: set[str] = set()
        self.accelerator: str | None = None  # device type of the trained parameters
        self.batches_seen = 0
        self.last_pad_share = 0.0
        self.count_flops_at = count_flops_at
        self._flop_counter: Any = None
        self.t_start = time.perf_counter()
        _CURRENT = self
        if not _FORK_HOOK_REGISTERED and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_disable_in_child)
            _FORK_HOOK_REGISTERED = True

    # ------------------------------------------------------------ guards
    def on(self) -> bool:
        """Should a hook act now? (cheap: called on every hooked call)"""
        return self.enabled and not self.internal and threading.get_ident() == self.thread

    def close(self) -> None:
        global _CURRENT
        self.enabled = False
        self.stop_flop_count()
        if _CURRENT is self:
            _CURRENT = None

    def observe(self, key: str, kind: str, **data: Any) -> bool:
        """Remember an observation once per key (emitted as an event at the end of the run)."""
        if key in self.observations:
            return False
        self.observations[key] = {"kind": kind, **data}
        return True

    # ------------------------------------------------------------ phases
    def open_eval(self) -> None:
        """Evaluation is sticky: from the first no-grad/eval forward (or no-grad data fetch)
        until training resumes, everything not in a nested phase is charged to "eval"."""
        if not self.eval_open:
            self.eval_open = True
            self.mon.begin("eval")

    def close_eval(self) -> None:
        if self.eval_open:
            self.eval_open = False
            self.mon.end("eval")

    # ------------------------------------------------------------ batches
    def on_batch(self, batch: Any) -> None:
        """Account a training batch from a DataLoader (samples, tokens, padding)."""
        from trainspeed.doctor.instrument.batch import batch_stats, find_tensors

        self.internal += 1
        try:
            self.batches_seen += 1
            sample = self.batches_seen <= SAMPLE_FIRST_BATCHES or self.batches_seen % SAMPLE_EVERY == 0
            stats = batch_stats(batch, measure_padding=sample)
            if stats is None:
                return
            # only CPU runs need to tell the loader's tensors from computed ones (syncs.py)
            if self.accelerator in (None, "cpu") and len(self.batch_ids) < 256:
                self.batch_ids.update(id(t) for _, t in find_tensors(batch))
            self.step_loader_batches += 1
            self.step_samples += stats.samples
            self.step_tokens += stats.tokens
            if stats.pad_tokens is not None:
                self.step_pad += stats.pad_tokens
                self.last_pad_share = stats.pad_tokens / stats.tokens if stats.tokens else 0.0
            else:  # not sampled: assume the padding share of the last measured batch
                self.step_pad += int(round(stats.tokens * self.last_pad_share))
            self._observe_batch(stats)
        finally:
            self.internal -= 1

    def _observe_batch(self, stats: BatchStats) -> None:
        obs = self.observations.get("batch")
        if obs is None:
            self.observe("batch", "batch", batch_size=stats.samples, seq_len=stats.seq_len,
                         pad_source=stats.pad_source, max_batch_size=stats.samples,
                         max_seq_len=stats.seq_len)
        else:
            obs["max_batch_size"] = max(obs.get("max_batch_size") or 0, stats.samples)
            if stats.seq_len is not None:
                obs["max_seq_len"] = max(obs.get("max_seq_len") or 0, stats.seq_len)
            if obs.get("pad_source") is None and stats.pad_source is not None:
                obs["pad_source"] = stats.pad_source

    # ------------------------------------------------------------ steps
    def end_step(self, optimizer: Any) -> None:
        """Close one training step (called after the primary optimizer stepped)."""
        self.internal += 1
        try:
            samples = self.step_samples if self.step_loader_batches else self.step_fwd_samples
            self.accumulation[self.step_backwards] += 1
            lr = None
            try:
                value = optimizer.param_groups[0].get("lr")
                # a tensor lr on an accelerator would need a sync to read: skip it
                if isinstance(value, (int, float)):
                    lr = float(value)
                elif isinstance(value, torch.Tensor) and value.device.type == "cpu":
                    lr = float(value)
            except (AttributeError, IndexError, TypeError):
                pass
            # the Monitor counts real tokens, with padding on top of them
            pad = min(self.step_pad, self.step_tokens)
            self.mon.step(samples=samples, tokens=self.step_tokens - pad, pad_tokens=pad,
                          loss=self.last_loss, lr=lr)
        finally:
            self.internal -= 1
        self.step_samples = self.step_tokens = self.step_pad = 0
        self.step_loader_batches = self.step_fwd_samples = self.step_backwards = 0
        self.batch_ids.clear()
        self.fwd_depth = 0  # heals a forward that raised on torch without always_call hooks
        self._flop_window()
        if self.max_steps is not None and self.mon.steps_done >= self.max_steps:
            raise StopDoctor(f"stopped after {self.mon.steps_done} steps")

    # ------------------------------------------------------------ FLOPs (for MFU)
    def _flop_window(self) -> None:
        """Count the FLOPs of one real step of the script with FlopCounterMode, between two
        step boundaries, instead of re-running the user's model (which we cannot do safely).
        The counted step runs slower, so it is marked as warm-up."""
        at = self.count_flops_at
        if at is None:
            return
        done = self.mon.steps_done
        if done == at and self._flop_counter is None:
            if self.observations.get("compiled"):
                self.count_flops_at = None  # dispatch modes and compiled graphs do not mix
                return
            try:
                from trainspeed.telemetry.flops import flop_counter

                counter = flop_counter()  # counts CPU attention too (see missing_formulas)
                counter.__enter__()
                self._flop_counter = counter
                self.mon.mark_warmup()  # the step now open is the counted (slower) one
            except Exception:  # noqa: BLE001 - MFU is optional; the diagnosis goes on
                self.count_flops_at = None
        elif done == at + 1 and self._flop_counter is not None:
            flops = self.stop_flop_count()
            if flops:
                self.internal += 1
                try:
                    self.mon.set_flops_per_step(float(flops))
                finally:
                    self.internal -= 1

    def stop_flop_count(self) -> int | None:
        counter, self._flop_counter = self._flop_counter, None
        if counter is None:
            return None
        try:
            counter.__exit__(None, None, None)
            return int(counter.get_total_flops())
        except Exception:  # noqa: BLE001
            return None

    @property
    def counting_flops(self) -> bool:
        return self._flop_counter is not None
