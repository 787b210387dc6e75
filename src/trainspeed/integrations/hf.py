"""Hugging Face Trainer: `TrainspeedCallback` times every optimizer step's phases into a
trainspeed run directory and adds the doctor's findings at the end of `train()`.

    from trainspeed.integrations.hf import TrainspeedCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[TrainspeedCallback()])

The Trainer's callback hooks mark step boundaries only (`on_step_begin`, `on_substep_end`,
`on_pre_optimizer_step`, `on_step_end`, then `on_log` / `on_evaluate` / `on_save`); forward and
backward happen inside one `training_step` with no hook between them. To split them honestly
the callback adds a forward pre-hook and a forward hook to the model (removed at the end of
training), so:

    previous step's end .. on_step_begin        data     (get_batch_samples: every micro-batch
                                                          of the step is fetched up front)
    on_step_begin .. model forward starts       h2d      (_prepare_inputs: the copy to the device,
                                                          unless the loader already made it)
    model forward (pre-hook .. hook)            forward  (the loss too, when the model computes it)
    forward end .. on_substep_end/pre_optimizer backward (+ a loss computed outside the model,
                                                          gradient clipping)
    on_pre_optimizer_step .. on_step_end        optimizer (step, scheduler, zero_grad)
    on_step_end .. on_log / on_evaluate / on_save  log / eval / ckpt, when the Trainer's control
                                                          flags say they happen at this step

Samples and tokens are counted from the model's inputs in the forward pre-hook (no device
reads); the loss is the Trainer's logged average at logging steps (it keeps the per-step loss
to itself), None in between.
"""

from __future__ import annotations

import atexit
import enum
import sys
from pathlib import Path
from typing import Any

from trainspeed.errors import require
from trainspeed.integrations._common import PhaseSwitch, count_batch, default_run_dir, finish

_tf = require("transformers", extra="hf", feature="trainspeed.integrations.hf")


class TrainspeedCallback(_tf.TrainerCallback):
    """Phase timing, the run directory and findings for `transformers.Trainer`. See module docstring."""

    def __init__(
        self,
        run_dir: str | Path | None = None,
        *,
        log_every: int = 50,
        warmup_steps: int = 5,
        sinks: tuple[Any, ...] = ("jsonl",),
        profile_steps: str | tuple[int, int] | None = None,
        flops_per_step: float | None = None,
        report: bool = True,
        html: bool = True,
    ) -> None:
        """run_dir: default `<args.output_dir>/trainspeed/hf-<time>`. profile_steps: 'START-END'
        for a torch.profiler trace of those steps. report: print the report (and write
        report.html when `html`) at the end of training."""
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._auto_dir = False  # True: a fresh default directory for every train()
        self._exit_hook = False  # atexit hook registered (closes a run a crash left open)
        self.log_every, self.warmup_steps, self.sinks = log_every, warmup_steps, tuple(sinks)
        self.profile_steps, self.flops_per_step = profile_steps, flops_per_step
        self.report, self.html = report, html
        self.monitor: Any = None
        self.summary: dict[str, Any] | None = None
        self.findings: list[dict[str, Any]] = []
        self._phase: PhaseSwitch | None = None
        self._handles: list[Any] = []
        self._in_step = False  # between on_step_begin and on_step_end: forwards are training
        self._post: list[str] = []  # interval work still expected after on_step_end
        self._counts = [0, 0, 0]
        self._loss: float | None = None
        self._lr: float | None = None

    # ------------------------------------------------------------ start / end
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        from trainspeed.telemetry.monitor import Monitor

        if self.monitor is not None and self.summary is None:  # the last train() raised
            self.close(error=RuntimeError("a new train() began before the previous one finished"))
        if not self._exit_hook:
            atexit.register(self._close_at_exit)
            self._exit_hook = True
        self.summary, self.findings = None, []  # a second train() is a new run
        self._in_step, self._post, self._counts, self._loss, self._lr = False, [], [0, 0, 0], None, None
        if self.run_dir is None or self._auto_dir:
            self._auto_dir = True
            self.run_dir = default_run_dir(args.output_dir, "hf")
        precision = "bf16-mixed" if args.bf16 else "fp16-mixed" if args.fp16 else "fp32"
        config = {
            "framework": "transformers",
            "model": type(model).__name__ if model is not None else None,
            "args": {k: getattr(args, k, None) for k in (
                "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps",
                "num_train_epochs", "learning_rate", "bf16", "fp16", "torch_compile",
                "dataloader_num_workers", "dataloader_pin_memory", "logging_steps", "eval_strategy",
                "save_strategy", "gradient_checkpointing", "optim")},
            "profile": {"steps": self.profile_steps},
        }
        device = next(model.parameters()).device if model is not None else args.device
        self.monitor = Monitor(
            self.run_dir, device=device, log_every=self.log_every, warmup_steps=self.warmup_steps,
            sinks=self.sinks, flops_per_step=self.flops_per_step, precision=precision,
            config=_plain(config), rank=args.process_index,
            total_steps=state.max_steps or None, profile_steps=self.profile_steps,
        )
        self._phase = PhaseSwitch(self.monitor)
        if model is not None:
            self._handles = [
                model.register_forward_pre_hook(self._forward_begin, with_kwargs=True),
                model.register_forward_hook(self._forward_end, always_call=True),
            ]

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def close(self, error: BaseException | None = None) -> None:
        """Finish the run directory (report.json, findings, report) if it is still open.

        transformers has no exception callback: when `trainer.train()` raises, call
        `callback.close(error=exc)` to record the traceback. A process that ends on the
        uncaught exception is covered without it: an exit hook closes the run with it."""
        if self.monitor is None or self.summary is not None:
            return
        if error is None:
            self._close_step()
        self._remove_hooks()
        self.summary, self.findings = finish(self.monitor, error=error, report=self.report, html=self.html)

    def _close_at_exit(self) -> None:
        if self.monitor is not None and self.summary is None:
            # The interpreter stores an uncaught exception in sys.last_value before exit hooks run.
            error = getattr(sys, "last_value", None) or RuntimeError(
                "the process ended before Trainer.train() finished")
            self.close(error=error)

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ------------------------------------------------------------ model hooks
    def _forward_begin(self, module: Any, args: Any, kwargs: Any) -> None:
        if not self._in_step or self._phase is None or self._phase.current == "forward":
            return  # evaluation, or a nested call: not a training forward
        samples, tokens, pad = count_batch(kwargs if kwargs else args)
        self._counts[0] += samples
        self._counts[1] += tokens
        self._counts[2] += pad
        self._phase.to("forward")

    def _forward_end(self, module: Any, args: Any, output: Any) -> None:
        if self._in_step and self._phase is not None and self._phase.current == "forward":
            self._phase.to("backward")

    # ------------------------------------------------------------ one step
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._phase is None:
            return
        if self._post:  # expected interval work never reported back: close the step now
            self._close_step()
        self._in_step = True
        self._phase.to("h2d")

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._phase is not None:
            self._phase.to("h2d")  # the next micro-batch's inputs are prepared next

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._phase is not None:
            self._phase.to("optimizer")

    def on_step_end(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        if self._phase is None:
            return
        self._in_step = False
        self._lr = _lr(optimizer)
        # The Trainer's flow callback ran before us: its flags say what follows this step.
        self._post = [name for name, due in (("log", control.should_log), ("eval", control.should_evaluate),
                                             ("ckpt", control.should_save)) if due]
        self._advance()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if self._post and self._post[0] == "log":
            loss = (logs or {}).get("loss")
            self._loss = float(loss) if isinstance(loss, (int, float)) else None
            self._post.pop(0)
            self._advance()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._post and self._post[0] == "eval":
            self._post.pop(0)
            self._advance()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._post and self._post[0] == "ckpt":
            self._post.pop(0)
            self._advance()

    def _advance(self) -> None:
        """Enter the next expected interval phase, or close the step and wait for data."""
        if self._post:
            self._phase.to(self._post[0])
        else:
            self._close_step()
            self._phase.to("data")

    def _close_step(self) -> None:
        if self._phase is None:
            return
        self._post = []
        self._phase.to(None)
        if self._counts == [0, 0, 0] and self._loss is None and not self._in_step and self._lr is None:
            return  # nothing since the last record
        s, t, p = self._counts
        self.monitor.step(samples=s, tokens=t, pad_tokens=p, loss=self._loss, lr=self._lr)
        self._counts, self._loss, self._lr = [0, 0, 0], None, None


def _lr(optimizer: Any) -> float | None:
    try:
        value = optimizer.param_groups[0]["lr"]
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def _plain(value: Any) -> Any:
    """TrainingArguments values (enums, paths) as YAML-safe plain values."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, enum.Enum):  # IntervalStrategy etc. are str subclasses YAML can't write
        return str(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(getattr(value, "value", value))
