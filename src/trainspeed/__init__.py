"""trainspeed: make PyTorch training fast, and prove it with measurements."""

from __future__ import annotations

__version__ = "0.1.0"

from trainspeed.mark import step  # noqa: E402  (a no-op outside the doctor; imports nothing)

# Heavy modules are imported lazily so `import trainspeed` and the CLI start fast.
_LAZY = {
    "Monitor": ("trainspeed.telemetry.monitor", "Monitor"),
    "read_run": ("trainspeed.telemetry.rundir", "read_run"),
    "Trainer": ("trainspeed.engine.trainer", "Trainer"),
    "Callback": ("trainspeed.engine.events", "Callback"),
    "Event": ("trainspeed.engine.events", "Event"),
    "TrainConfig": ("trainspeed.config", "TrainConfig"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'trainspeed' has no attribute {name!r}")


__all__ = ["__version__", "step", *_LAZY]
