"""The state every hook family shares while a foreign script runs under the doctor.

One `Session` per doctor run. Hooks call `session.on()` first: it is False in forked DataLoader
workers, in other threads (the Monitor's writer, Lightning's helpers), while the doctor itself
is working (`internal`), and after the run; then the hook is a plain pass-through.

Step boundaries, from the first source that shows one (`boundary` says which):

- "optimizer": a step of the *primary* optimizer (the first one that steps), so a GAN's two
  optimizers make one step (one iteration). When another optimizer goes on stepping alone, far
  longer than it ever did between the primary's steps (layer-wise training: pytorch/examples'
  mnist_forward_forward trains each layer with its own Adam, one after the other), it becomes
  the primary (optimizer.py, HANDOVER_MIN); each optimizer's micro-batches per update are
  its own new inputs (updates.py), not the backward calls. Forwards and backwards inside
  `optimizer.step(closure)` (LBFGS) are closure evaluations of one batch, not micro-batches.
- "backward": no torch.optim optimizer ever stepped (manual SGD `p.data.add_(p.grad, ...)`, a
  custom optimizer): the training module's next training forward after a backward closes the
  step, when the backward's gradients were consumed by then (the module's gradients are None or
  zero again, as `model.zero_grad()` leaves them) or its parameters changed since that backward
  (forward, `zero_grad`, backward, update: the gradients are still there at the next forward).
  Gradients still there on unchanged parameters are accumulation: the step goes on. Once an optimizer step is seen, it is the boundary (no double count).
- "mark": the script calls `trainspeed.step()`; from the first mark on, only marks close steps.
- "engine": a training engine that owns the step (DeepSpeed's `engine.step()`, deepspeed.py)
  closes it when the step applied an update (its accumulation boundary); the torch optimizer
  it steps underneath (once per parameter group, under ZeRO) closes nothing.

What a step trained on (samples, tokens, padding) is counted in step_inputs.py; each optimizer's
own loss, where several step (a GAN's D and G), in update_losses.py.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import Counter
from typing import Any

import torch

from trainspeed import mark
from trainspeed.doctor.instrument.flop_window import FlopWindow
from trainspeed.doctor.instrument.moved import mark_params, params_moved
from trainspeed.doctor.instrument.phase_view import HookPhases
from trainspeed.doctor.instrument.progress import progress_for
from trainspeed.doctor.instrument.sites import SiteCounter
from trainspeed.doctor.instrument.step_facts import grads_consumed, optimizer_lr
from trainspeed.doctor.instrument.step_inputs import (  # noqa: F401 - the limits stay importable from here
    MAX_MODULES, MAX_SHAPES, SAMPLE_EVERY, SAMPLE_FIRST_BATCHES, StepInputs)
from trainspeed.doctor.instrument.update_losses import UpdateLosses, update_loss
from trainspeed.doctor.instrument.updates import Updates


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


class Session(StepInputs):
    """Shared state of one doctor run. See module docstring."""

    def __init__(self, monitor: Any, *, max_steps: int | None, count_flops_at: int | None = None,
                 time_limit: tuple[float, int] | None = None) -> None:
        global _CURRENT, _FORK_HOOK_REGISTERED
        self.mon = HookPhases(monitor, self)
        self.max_steps = max_steps
        self.on_first_step: Any = None
        """Called once, when the script's first step closes (the runner's late signal handler)."""
        # (seconds, steps): stop once this old with at least that many steps (DoctorConfig.max_seconds)
        self.time_limit = time_limit
        self.t_start = time.perf_counter()
        self.progress = progress_for(max_steps)  # a line a minute on a terminal (progress.py)
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
        self.data_open = False  # batch-building calls in the main process opened "data" (transfers.py)
        self.eval_loader = False  # the open evaluation fetched from a DataLoader
        self.eval_rollout = False  # the open "eval" is an RL rollout (module.py): open until training resumes
        self.rollout_run = 0  # rollout-like no-grad forwards since the last training forward (module.py)
        self.primary_opt: int | None = None
        self.other_run: tuple[int | None, int] = (None, 0)  # (another optimizer, its steps in a row since the primary's)
        self.other_run_max = 0  # the longest such run while the primary still stepped
        self.handed_from: dict[int, int] = {}  # optimizer -> the primary it took the boundary from
        self.alternating: set[frozenset[int]] = set()  # optimizer pairs seen to take turns: no more hand-overs
        self.opt_depth = 0  # inside an optimizer's step(): closure forwards/backwards
        self.engine_depth = 0  # inside a training engine's step (DeepSpeed): it closes the step
        self.ckpt_call: list[int] | None = None  # [files, bytes] of a framework's save call in progress
        self.scaled_loss: tuple[Any, Any] | None = None  # (weakref to GradScaler.scale's result, the loss)
        self.boundary: str | None = None  # "optimizer", "backward" or "mark" (module docstring)
        self.train_module: int | None = None  # id of the module whose forwards count samples
        self.train_module_ref: Any = None  # weakref to it (its gradients tell a step from accumulation)
        self.param_marks: list[tuple[int, int, Any]] = []  # its parameters at the last backward (moved.py)
        self.unseen_forward_steps = 0  # steps opened by a backward: their forwards ran unseen (compiled)
        self.last_inputs: tuple[dict[tuple[int, ...], int], int, int] = ({}, 0, 0)  # the last seen forward's batch
        self.module_facts: dict[int, tuple[bool, bool]] = {}  # id -> (trainable, sequence-first)
        self.batch_dims: dict[int, int] = {}  # id(train module) -> batch dim of its input
        self.seq_probe: tuple[int, tuple[int, ...]] | None = None  # (module id, input shape) to resolve
        self.inputs_seen = 0
        self.in_pad_source: str | None = None
        self.seen = Counter()  # whole run: training forwards, backwards, optimizer steps, marks
        self.updates = Updates()  # which module each optimizer updates, micro-batches per update
        self.step_micro: int | None = None  # the primary optimizer's micro-batches this step
        # per-step accumulators, reset at each step boundary
        self.step_samples = 0
        self.step_tokens = 0
        self.step_pad = 0
        self.step_loader_batches = 0
        self.step_fwd_samples = 0  # written by module.py; samples come from step_shapes instead
        self.step_backwards = 0
        self.step_closure_backwards = 0
        self.step_forwards = 0  # training forwards of the training module
        self.step_trained_forwards = 0  # training forwards of any module with trainable parameters
        self.step_shapes: dict[tuple[int, ...], int] = {}  # its inputs' shapes, counted (samples at step end)
        self.unbatched_widths: dict[int, int | None] = {}  # module id -> its first Linear's in_features
        self.step_in_tokens = 0  # token ids in its inputs (steps without a DataLoader batch)
        self.step_in_pad = 0
        self.bwd_since_fwd = False
        self.batch_ids: set[int] = set()
        self.last_loss: Any = None
        self.loss_sum: Any = None  # the step's backwarded losses, summed on their device
        self.loss_first: Any = None
        self.losses = 0
        self.scaled_losses = 0  # backwarded losses that were divided/multiplied by a constant
        # two optimizers built at two lines, or two stepping (optimizer.py): each one's loss is its
        # own (update_losses.py), and the step's loss is the primary's, not their blend
        self.several_optimizers = False
        self.last_update_loss: Any = None
        self.primary_loss: tuple[Any] | None = None  # (the primary's loss,) for the step it closes
        # whole-run aggregates (bounded: keyed by code sites, objects, or small counts)
        self.accumulation: Counter[int] = Counter()
        self.closure_evaluations: Counter[int] = Counter()
        self.sites = SiteCounter()
        self.observations: dict[str, dict[str, Any]] = {}
        self.update_losses = UpdateLosses(self.mon, self.observations)
        # the script's DataLoader iterators: their workers are stopped when the script is over
        # (dataloader.stop_workers)
        self.loader_iterators: weakref.WeakSet[Any] = weakref.WeakSet()
        self.loaders: dict[int, dict[str, Any]] = {}
        self.checkpoint_paths: set[str] = set()
        self.accelerator: str | None = None  # device type of the trained parameters
        self.batches_seen = 0
        self.last_pad_share = 0.0
        self.flops = FlopWindow(count_flops_at)
        self.t_start = time.perf_counter()
        _CURRENT = self
        self._previous_mark = mark.set_step_handler(self.mark_step)
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
        self.update_losses.finish()
        self.flops.stop()
        if mark._handler == self.mark_step:  # noqa: SLF001 - ours: give the previous one back
            mark.set_step_handler(self._previous_mark)
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
        until its work ends, everything not in a nested phase is charged to "eval". Its work
        ends when the `torch.no_grad()`/`inference_mode()` block around it exits (autograd.py),
        unless it iterates an evaluation DataLoader (its fetches are inside the eval; the loop
        may re-enter no_grad per batch): then when training resumes."""
        if self.in_data:
            self.eval_loader = True
        if not self.eval_open:
            self.close_data()
            self.eval_open = True
            self.mon.begin("eval")

    def close_eval(self) -> None:
        if self.eval_open:
            self.eval_open = False
            self.eval_loader = self.eval_rollout = False
            self.mon.end("eval")

    def open_data(self) -> None:
        """Batch building in the main process (nanoGPT's get_batch: torch.randint, memmap slices
        through torch.from_numpy, torch.stack) outside every other phase: "data" until the next
        phase transition of any hook (see transfers.py)."""
        if not self.data_open:
            self.data_open = True
            self.mon.monitor.begin("data")

    def close_data(self) -> None:
        if self.data_open:
            self.data_open = False
            self.mon.monitor.end("data")

    # ------------------------------------------------------------ training forwards
    def on_train_forward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        """An outermost training forward is about to run (autograd.py, before the "forward"
        phase opens). May close the step (and raise StopDoctor) before the forward starts."""
        self.close_data()
        trainable, seq_first = self.module_facts_of(module)
        if not trainable:
            return  # a loss module: not the training batch, not a step boundary
        self.step_trained_forwards += 1
        if not self.opt_depth:
            self.internal += 1
            try:
                self.updates.on_forward(module, args)
            finally:
                self.internal -= 1
        key = id(module)
        if self.train_module is None:
            self.train_module = key
            self.train_module_ref = weakref.ref(module)
        elif key != self.train_module:
            return
        self.seen["forwards"] += 1
        if self.opt_depth:
            if self.step_forwards:
                return  # a closure re-evaluating the step's batch (LBFGS)
        elif (self.bwd_since_fwd and self.primary_opt is None and self.boundary in (None, "backward")
              and self._step_done(module)):
            self._close("backward", None)  # may raise StopDoctor: the forward has not started
        self.bwd_since_fwd = False
        self.step_forwards += 1
        if self.step_loader_batches:
            return  # the DataLoader's batch is the step's batch
        self._account_input(module, seq_first, args)

    def _step_done(self, module: torch.nn.Module) -> bool:
        """Did the last backward's update happen (no torch.optim step to say so)?"""
        return self._grads_consumed(module) or self._params_moved(module)

    def _mark_params(self) -> None:
        """The training module's parameters as a backward starts (moved.py)."""
        module = self.train_module_ref() if self.train_module_ref is not None else None
        if module is None:
            return
        self.internal += 1
        try:
            self.param_marks = mark_params(module)
        finally:
            self.internal -= 1

    def _params_moved(self, module: torch.nn.Module) -> bool:
        """Did the training module's parameters change since the last backward started?"""
        self.internal += 1
        try:
            return params_moved(module, self.param_marks)
        finally:
            self.internal -= 1

    def _grads_consumed(self, module: torch.nn.Module) -> bool:
        """step_facts.grads_consumed, unseen by the hooks."""
        self.internal += 1
        try:
            return grads_consumed(module)
        finally:
            self.internal -= 1

    # ------------------------------------------------------------ backwards
    def on_backward(self, tensor: Any, unscaled: Any = None) -> None:
        """A backward starts (autograd.py). `unscaled`: the loss before GradScaler.scale. May
        close the step first (and raise StopDoctor) when its forward ran unseen."""
        if (self.bwd_since_fwd and not self.opt_depth and self.primary_opt is None
                and self.boundary in (None, "backward")):
            self._close_unseen_forward()
        if self.opt_depth:
            self.step_closure_backwards += 1
        else:
            self.step_backwards += 1
            self.updates.backwards += 1
            if self.primary_opt is None and self.boundary in (None, "backward"):
                self._mark_params()
        self.seen["backwards"] += 1
        self.bwd_since_fwd = True
        if not isinstance(tensor, torch.Tensor) or tensor.numel() != 1:
            return
        value = unscaled if unscaled is not None else tensor
        grad_fn = type(value.grad_fn).__name__ if value.grad_fn is not None else ""
        loss = value.detach()
        self.last_loss = loss
        if self.opt_depth:
            if self.loss_first is None:
                self.loss_first = loss  # what optimizer.step(closure) returns: the first evaluation
            return
        self.internal += 1
        try:
            self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss  # on its device: no sync
        finally:
            self.internal -= 1
        self.losses += 1
        self.scaled_losses += grad_fn.startswith(("DivBackward", "MulBackward"))

    def _close_unseen_forward(self) -> None:
        """A backward with no training forward since the last one, whose gradients were used and
        cleared meanwhile: the forward ran where the hooks cannot see it. A module compiled in
        place (`model.compile()`, the script tuner's compile) runs the module hooks inside its
        compiled graph: pytorch/examples' word_language_model (manual SGD, no optimizer) showed
        one forward and 125 backwards, and no step at all. The backward then opens the next
        step; its batch is the last one a forward showed (the same loop feeds the same shapes).
        Gradients still there are two backwards of one step (retain_graph): nothing closes."""
        module = self.train_module_ref() if self.train_module_ref is not None else None
        if module is None or not self._step_done(module):
            return
        if self.step_shapes:
            self.last_inputs = (dict(self.step_shapes), self.step_in_tokens, self.step_in_pad)
        self._close("backward", None)  # may raise StopDoctor: this backward has not started
        self.unseen_forward_steps += 1
        if not self.step_loader_batches:
            shapes, self.step_in_tokens, self.step_in_pad = self.last_inputs
            self.step_shapes = dict(shapes)

    def step_loss(self) -> Any:
        """The loss the script sees for the step: one backward's loss; over micro-batches the
        sum of the backwarded losses when the script scaled them (`loss / accum`, whose sum is
        the batch's mean loss, what nanoGPT prints), their mean when it did not; a closure
        optimizer's first evaluation."""
        if self.losses == 0:
            return self.loss_first
        if self.losses == 1 or self.scaled_losses == self.losses:
            return self.loss_sum
        self.internal += 1
        try:
            return self.loss_sum / self.losses
        finally:
            self.internal -= 1

    def on_update(self, optimizer: Any, micro: int | None) -> None:
        """An optimizer's update (optimizer.py: outermost, not a training engine's). With several
        optimizers, the losses backwarded since the previous update are this one's: recorded
        under its name, and taken out of the step's (update_losses.py)."""
        if not self.several_optimizers or self.boundary == "mark":
            return
        primary = id(optimizer) == self.primary_opt
        self.internal += 1
        try:
            loss = update_loss(self.loss_sum, self.losses, self.scaled_losses, self.loss_first, micro)
            if loss is None:  # no backward of its own: it applies the previous update's gradients' loss
                loss = self.last_update_loss
            self.last_update_loss = loss
            done = self.mon.steps_done
            # the primary's update closes the next step; another's belongs to the last one closed
            self.update_losses.add(optimizer, done if primary else max(done - 1, 0), loss, primary=primary)
        finally:
            self.internal -= 1
        if primary:
            self.primary_loss = (loss,)
        self.loss_sum = self.loss_first = None
        self.losses = self.scaled_losses = 0

    # ------------------------------------------------------------ steps
    def end_step(self, optimizer: Any = None) -> None:
        """The primary optimizer stepped (optimizer.py): close one training step, unless the
        script marks its steps with trainspeed.step()."""
        self.seen["optimizer_steps"] += 1
        if self.boundary != "mark":
            self._close("optimizer", optimizer)

    def end_engine_step(self, optimizer: Any = None) -> None:
        """A training engine's step applied an update (deepspeed.py): close one training step,
        unless the script marks its steps with trainspeed.step()."""
        self.seen["optimizer_steps"] += 1
        if self.boundary != "mark":
            self._close("engine", optimizer)

    def mark_step(self) -> None:
        """`trainspeed.step()`: from the first call on, only marks close steps. A first mark
        right after an optimizer step that closed the step already closes nothing."""
        if not self.on():
            return
        self.seen["marks"] += 1
        first = self.boundary != "mark"
        self.boundary = "mark"
        if first and not (self.step_forwards or self.step_backwards or self.step_closure_backwards
                          or self.step_loader_batches):
            return
        self._close("mark", None)

    def _close(self, source: str, optimizer: Any) -> None:
        self.boundary = source
        self.internal += 1
        try:
            if self.step_loader_batches:
                samples, tokens, pad = self.step_samples, self.step_tokens, self.step_pad
            else:
                samples, tokens, pad = self._input_samples(), self.step_in_tokens, self.step_in_pad
            closure = self.step_closure_backwards
            # an optimizer's update counts its own micro-batches (updates.py): a GAN's three
            # backwards per iteration are two updates of one batch each
            micro = self.step_micro if source == "optimizer" and self.step_micro and not closure else None
            self.accumulation[micro or self.step_backwards or (1 if closure else 0)] += 1
            if closure:
                self.closure_evaluations[closure] += 1
            lr = optimizer_lr(optimizer)  # None where reading it would need a sync
            # the Monitor counts real tokens, with padding on top of them
            pad = min(pad, tokens)
            # several optimizers: the primary's own loss (on_update), not the step's blend
            loss = self.primary_loss[0] if self.primary_loss is not None else self.step_loss()
            self.mon.step(samples=samples, tokens=tokens - pad, pad_tokens=pad, loss=loss, lr=lr)
            if self.several_optimizers:
                self.update_losses.after_step(self.mon.steps_done)
        finally:
            self.internal -= 1
            self.primary_loss = None
        self.step_samples = self.step_tokens = self.step_pad = self.step_in_tokens = self.step_in_pad = 0
        self.step_loader_batches = self.step_fwd_samples = self.step_backwards = 0
        self.step_closure_backwards = self.step_forwards = self.step_trained_forwards = 0
        self.step_micro, self.step_shapes = None, {}
        self.loss_sum = self.loss_first = None
        self.losses = self.scaled_losses = 0
        self.bwd_since_fwd = False
        self.batch_ids.clear()
        self.fwd_depth = 0  # heals a forward that raised on torch without always_call hooks
        self.flops.after_step(self)
        if self.on_first_step is not None:
            first, self.on_first_step = self.on_first_step, None
            first()
        if self.progress is not None:
            self.progress(self.mon.steps_done)
        if self.max_steps is not None and self.mon.steps_done >= self.max_steps:
            raise StopDoctor(f"stopped after {self.mon.steps_done} steps")
        if (self.time_limit is not None and self.mon.steps_done >= self.time_limit[1]
                and time.perf_counter() - self.t_start >= self.time_limit[0]):
            raise StopDoctor(f"stopped after {self.mon.steps_done} steps ({self.time_limit[0]:.0f} s)")
