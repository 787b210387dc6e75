"""The Trainer's evaluation pass: the validation loss (weighted by samples, or by tokens when
accumulation normalizes by tokens), reduced over ranks, plus the user's own eval metrics, timed
as the "eval" phase and recorded as an `eval` event."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterable

import torch

from trainspeed.engine.data.prefetch import move_to_device
from trainspeed.engine.data.stats import batch_stats as default_batch_stats
from trainspeed.engine.events import Event

if TYPE_CHECKING:
    from trainspeed.engine.trainer_view import TrainerView


def evaluate(trainer: "TrainerView", val_loader: Iterable[Any] | None, mon: Any) -> dict[str, float]:
    """Evaluate `trainer`'s model on `val_loader` (at most eval.limit_val_batches batches);
    the metrics, also kept in trainer.state.metrics with the step they belong to."""
    if val_loader is None:
        return {}
    st, cfg, device = trainer.state, trainer.cfg, trainer.device
    limit = cfg.eval.limit_val_batches
    trainer.callbacks.fire(Event.EVAL_START, st)
    t0 = time.perf_counter()
    stats_fn = trainer.data.batch_stats or default_batch_stats
    # Under DeepSpeed through its engine: with ZeRO-3 only the engine gathers the parameters.
    model = trainer._ds if trainer._ds is not None else trainer.eager
    with mon.phase("eval"):
        trainer.eager.eval()
        total = torch.zeros((), device=device)
        weight_sum = 0
        with torch.no_grad(), trainer.precision.autocast():
            for i, batch in enumerate(val_loader):
                if limit is not None and i >= limit:
                    break
                s = stats_fn(batch)
                w = s.tokens if cfg.accumulation.normalize == "tokens" and s.tokens else s.samples
                batch = move_to_device(batch, device, cfg.data.non_blocking)
                total += trainer._loss(model, batch).detach().float() * w
                weight_sum += w
        if trainer.dist.active:  # every rank evaluated its shard of the validation data
            pair = trainer.dist.reduce_sum_(torch.stack([total.double(), total.new_tensor(float(weight_sum), dtype=torch.float64)]),
                                            "validation loss all-reduce")
            total, weight_sum = pair[0], int(pair[1].item())
        metrics = {"val_loss": float(total.item()) / max(weight_sum, 1)}  # one sync per evaluation
        if trainer.eval_metrics is not None:
            metrics.update(trainer.eval_metrics(trainer.eager, val_loader))
        trainer.eager.train()
    st.metrics = {**metrics, "_at_step": st.step}
    # The step whose optimizer update was evaluated, as its checkpoint and step record name it:
    # mid-step (the step's Monitor record is closed after its interval work) the Monitor's own
    # count is still the step before.
    mon.event("eval", step=st.step, seconds=time.perf_counter() - t0, **metrics)
    trainer.callbacks.fire(Event.EVAL_END, st)
    return metrics
