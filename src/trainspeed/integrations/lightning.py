"""PyTorch Lightning: `TrainspeedCallback` times every training step's phases into a trainspeed
run directory and adds the doctor's findings at the end of `fit`.

    from trainspeed.integrations.lightning import TrainspeedCallback
    trainer = L.Trainer(max_steps=1000, callbacks=[TrainspeedCallback("runs/exp1")])

What Lightning's public callback hooks let us time (automatic optimization):

    on_train_batch_end .. on_train_batch_start   data  (loader wait, the batch's copy to the
                                                        device, Lightning's per-batch bookkeeping)
    on_train_batch_start .. on_before_backward    forward (training_step, loss, zero_grad)
    on_before_backward .. on_after_backward       backward
    on_after_backward .. on_before_optimizer_step other (tiny)
    on_before_optimizer_step .. on_train_batch_end optimizer (clipping, optimizer.step())
    on_validation_start .. on_validation_end      eval

One step record per optimizer step (batches accumulated with `accumulate_grad_batches` are
summed into it). With manual optimization there is no backward/optimizer hook from Lightning:
the whole training_step is "forward" and each batch is one step. No hook reads device memory:
the loss goes to the Monitor as a device tensor and is read back at the log interval.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from trainspeed.errors import require
from trainspeed.integrations._common import PhaseSwitch, call_counter, default_run_dir, finish, loss_value

_pl = require("lightning.pytorch", package="lightning", extra="lightning",
              feature="trainspeed.integrations.lightning")


class TrainspeedCallback(_pl.Callback):
    """Phase timing, the run directory and findings for a Lightning `fit`. See module docstring."""

    def __init__(
        self,
        run_dir: str | Path | None = None,
        *,
        log_every: int = 50,
        warmup_steps: int = 5,
        sinks: tuple[Any, ...] = ("jsonl",),
        profile_steps: str | tuple[int, int] | None = None,
        batch_stats: Callable[[Any], Any] | None = None,
        flops_per_step: float | None = None,
        report: bool = True,
        html: bool = True,
    ) -> None:
        """run_dir: default `<trainer.default_root_dir>/trainspeed/lightning-<time>`.
        profile_steps: 'START-END' for a torch.profiler trace of those steps.
        batch_stats: batch -> samples or (samples, tokens[, pad_tokens]); default: the first
        tensor's batch dimension (tokens from `input_ids`/`attention_mask` when present).
        report: print the report (and write report.html when `html`) at the end of fit."""
        super().__init__()
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._auto_dir = False  # True: a fresh default directory for every fit()
        self.log_every, self.warmup_steps, self.sinks = log_every, warmup_steps, tuple(sinks)
        self.profile_steps, self.batch_stats = profile_steps, batch_stats
        self.flops_per_step, self.report, self.html = flops_per_step, report, html
        self.monitor: Any = None
        self.summary: dict[str, Any] | None = None
        self.findings: list[dict[str, Any]] = []
        self._phase: PhaseSwitch | None = None
        self._stepped = False
        self._counts = [0, 0, 0]
        self._loss: Any = None

    # ------------------------------------------------------------ start / end
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        from trainspeed.telemetry.monitor import Monitor

        self.summary, self.findings = None, []  # a second fit() is a new run
        self._stepped, self._counts, self._loss = False, [0, 0, 0], None
        if self.run_dir is None or self._auto_dir:
            self._auto_dir = True
            self.run_dir = default_run_dir(trainer.default_root_dir, "lightning")
        config = {
            "framework": "lightning",
            "model": type(pl_module).__name__,
            "trainer": {
                "max_steps": trainer.max_steps, "max_epochs": trainer.max_epochs,
                "precision": str(trainer.precision),
                "accumulate_grad_batches": trainer.accumulate_grad_batches,
                "world_size": trainer.world_size,
            },
            "profile": {"steps": self.profile_steps},
        }
        self.monitor = Monitor(
            self.run_dir, device=pl_module.device, log_every=self.log_every,
            warmup_steps=self.warmup_steps, sinks=self.sinks, flops_per_step=self.flops_per_step,
            precision=str(trainer.precision), config=config, rank=trainer.global_rank,
            total_steps=trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None,
            profile_steps=self.profile_steps,
        )
        self._phase = PhaseSwitch(self.monitor)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._finish(exception)

    def _finish(self, error: BaseException | None) -> None:
        if self.monitor is None or self.summary is not None:
            return
        self._phase.to(None)
        self.summary, self.findings = finish(self.monitor, error=error, report=self.report, html=self.html)

    # ------------------------------------------------------------ one batch
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._phase is None:
            return
        self._phase.to("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self._phase is not None:
            self._phase.to("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self._phase is not None:
            self._phase.to(None)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._phase is not None:
            self._phase.to("optimizer")
            self._stepped = True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._phase is None:
            return
        self._phase.to(None)
        samples, tokens, pad = call_counter(self.batch_stats, batch)
        self._counts[0] += samples
        self._counts[1] += tokens
        self._counts[2] += pad
        loss = loss_value(outputs)
        if loss is not None:
            self._loss = loss
        if self._stepped or not pl_module.automatic_optimization:
            s, t, p = self._counts
            self.monitor.step(samples=s, tokens=t, pad_tokens=p, loss=self._loss, lr=_lr(trainer))
            self._counts = [0, 0, 0]
            self._stepped, self._loss = False, None
        self._phase.to("data")  # until the next batch starts: loader wait and the device copy

    # ------------------------------------------------------------ evaluation
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self._phase is not None and not trainer.sanity_checking:
            self._phase.to("eval")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._phase is not None and not trainer.sanity_checking:
            self._phase.to("data")


def _lr(trainer: Any) -> float | None:
    try:
        value = trainer.optimizers[0].param_groups[0]["lr"]
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None
