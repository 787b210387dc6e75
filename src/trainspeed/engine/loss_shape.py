"""A loss_fn that returns more than one number, said as what it is.

`loss.backward()` on a per-sample loss (a `reduction="none"` criterion, a forgotten `.mean()`)
raises torch's "grad can be implicitly created only for scalar outputs" from deep in the step,
after a crash checkpoint of nothing: a new user's own model ended so, although the FLOP count
had already named the cause in a warning. Checked only once backward has failed (an `except`
costs nothing on the step that does not raise)."""

from __future__ import annotations

from typing import Any

from trainspeed.errors import ConfigError


def raise_if_not_scalar(loss: Any, exc: BaseException) -> None:
    """Raise a ConfigError naming loss_fn when `loss` (what it returned) is not one number."""
    import torch

    if isinstance(loss, torch.Tensor) and loss.numel() != 1:
        raise ConfigError(
            f"loss_fn(model, batch) must return one number, a scalar loss tensor; it returned a tensor of "
            f"shape {tuple(loss.shape)}. Reduce it in your loss_fn (loss.mean(), or the criterion's "
            f"reduction='mean') ({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc
