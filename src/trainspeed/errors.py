"""User-facing errors. Every message says what was given, what is allowed, and how to fix it."""

from __future__ import annotations


class TrainspeedError(Exception):
    """Base class of every error trainspeed raises on purpose."""


class ConfigError(TrainspeedError, ValueError):
    """A setting is unknown or out of range: `data.num_workers must be >= 0, got -2`."""


class SchemaError(TrainspeedError):
    """A run directory record has a schema this version cannot read."""


class RunDirError(TrainspeedError):
    """A run directory is missing or lacks the files a command needs."""


class CheckpointError(TrainspeedError):
    """A checkpoint is corrupt, truncated, or does not fit the model/optimizer."""


class MissingDependencyError(TrainspeedError, ImportError):
    """An optional dependency is needed for a feature; the message names the extra to install."""

    def __init__(self, package: str, extra: str, feature: str):
        self.package, self.extra, self.feature = package, extra, feature
        super().__init__(
            f"{feature} needs the '{package}' package, which is not installed. "
            f"Install it with: pip install 'trainspeed[{extra}]'"
        )


def require(module: str, *, package: str | None = None, extra: str, feature: str):
    """Import an optional module lazily, or raise MissingDependencyError naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - exercised when the extra is absent
        raise MissingDependencyError(package or module.split(".")[0], extra, feature) from exc
