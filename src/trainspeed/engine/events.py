"""Typed events of the training loop and the Callback base (Composer-style).

The Trainer calls `callbacks.fire(Event.X, state)` at each point of the loop; a Callback
overrides `on_event` or the method named after the event (`on_batch_end`, ...). Callbacks
observe: they read `TrainerState` and must not mutate training state (model, optimizer,
data). Monitoring, logging and checkpointing are built this way.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from trainspeed.engine.trainer_view import TrainerView


class Event(enum.Enum):
    FIT_START = "fit_start"
    EPOCH_START = "epoch_start"
    BATCH_START = "batch_start"
    AFTER_FORWARD = "after_forward"
    AFTER_BACKWARD = "after_backward"
    OPTIMIZER_STEP = "optimizer_step"
    BATCH_END = "batch_end"
    EPOCH_END = "epoch_end"
    EVAL_START = "eval_start"
    EVAL_END = "eval_end"
    CHECKPOINT = "checkpoint"
    ANOMALY = "anomaly"
    FIT_END = "fit_end"

    # Members are singletons: identity hashing is valid and skips Enum's Python-level
    # __hash__ (a dict lookup per fired event, several events every step).
    __hash__ = object.__hash__


@dataclass
class TrainerState:
    """What callbacks may read. Counters are host-side ints; `loss` may be a device tensor
    (reading it with .item() is a sync: do that only at intervals)."""

    trainer: "TrainerView"
    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_in_epoch: int = 0
    samples: int = 0
    tokens: int = 0
    loss: Any = None
    lr: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # last evaluation's metrics
    info: dict[str, Any] = field(default_factory=dict)  # event payload (checkpoint path, ...)
    should_stop: bool = False


class Callback:
    """Base class with no-op methods. Override `on_<event>` or `on_event`."""

    def on_event(self, event: Event, state: TrainerState) -> None:
        handler = getattr(self, f"on_{event.value}", None)
        if handler is not None:
            handler(state)

    def on_fit_start(self, state: TrainerState) -> None: ...
    def on_epoch_start(self, state: TrainerState) -> None: ...
    def on_batch_start(self, state: TrainerState) -> None: ...
    def on_after_forward(self, state: TrainerState) -> None: ...
    def on_after_backward(self, state: TrainerState) -> None: ...
    def on_optimizer_step(self, state: TrainerState) -> None: ...
    def on_batch_end(self, state: TrainerState) -> None: ...
    def on_epoch_end(self, state: TrainerState) -> None: ...
    def on_eval_start(self, state: TrainerState) -> None: ...
    def on_eval_end(self, state: TrainerState) -> None: ...
    def on_checkpoint(self, state: TrainerState) -> None: ...
    def on_anomaly(self, state: TrainerState) -> None: ...
    def on_fit_end(self, state: TrainerState) -> None: ...


class CallbackList:
    """Fires events to callbacks. Only events some callback overrides cost anything per step."""

    def __init__(self, callbacks: Sequence[Callback] = ()) -> None:
        self.callbacks = list(callbacks)
        # Per event, the bound handlers of the callbacks that override it (none: an empty
        # tuple). A loop may call them itself (`for h in callbacks.handlers[Event.X]: h(state)`):
        # no fire() frame, and nothing at all for an event no callback overrides. A new dict
        # whenever a callback is added: read it again at each step.
        self.handlers: dict[Event, tuple[Callable[[TrainerState], None], ...]] = {}
        self.listening: frozenset[Event] = frozenset()
        self._index()

    def _index(self) -> None:
        # Bound handlers resolved once: fire() then costs one call per listener, not an
        # f-string and a getattr per event per callback (several events fire every step).
        handlers: dict[Event, list[Callable[[TrainerState], None]]] = {e: [] for e in Event}
        for cb in self.callbacks:
            overrides_generic = type(cb).on_event is not Callback.on_event
            for event in Event:
                name = f"on_{event.value}"
                if overrides_generic:
                    handlers[event].append(functools.partial(cb.on_event, event))
                elif getattr(type(cb), name) is not getattr(Callback, name):
                    handlers[event].append(getattr(cb, name))
        self.handlers = {e: tuple(h) for e, h in handlers.items()}
        # Events some callback listens to: the loop skips the fire() call for the others
        # (`if Event.X in callbacks.listening`), saving a call per event per step.
        self.listening = frozenset(e for e, h in handlers.items() if h)

    def append(self, callback: Callback) -> None:
        self.callbacks.append(callback)
        self._index()

    def fire(self, event: Event, state: TrainerState) -> None:
        # A callback's exception propagates: the Trainer's crash path saves an emergency
        # checkpoint and writes the report with the traceback, so nothing is lost.
        for handler in self.handlers[event]:
            handler(state)
