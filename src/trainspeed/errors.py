"""User-facing errors. Every message says what was given, what is allowed, and how to fix it."""

from __future__ import annotations

import errno
import warnings


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


class TuneError(TrainspeedError):
    """The tune cannot proceed (e.g. the baseline itself fails)."""


NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})
"""The errnos of a write that did not fit: a full disk, or a quota spent."""


class DiskFullError(CheckpointError):
    """A checkpoint (or a run-directory file) did not fit on its disk. The message is one line:
    `no space left on PATH: N MB needed, M free`; the CLI exits with `exit_code`."""

    exit_code = 28
    """errno ENOSPC ("No space left on device"): a script or scheduler can tell a full disk
    from a crash (1), a bad setting (2) or a signal (128 + N)."""

    def __init__(self, path: object, needed: int | None, free: int | None, *, what: str = "checkpoint"):
        self.path, self.needed, self.free, self.what = path, needed, free, what
        need = f"{needed / 1e6:.1f} MB needed" if needed else "more space needed"
        have = f"{free / 1e6:.1f} MB free" if free is not None else "free space unknown"
        super().__init__(f"no space left on {path}: {need}, {have} (the {what} was not written; "
                         "free space there, or point checkpoint.dir at a larger disk)")


class OutputSetError(TrainspeedError, OSError):
    """Files meant to land together (a tune's best.yaml, best.patch and tables: trainspeed.fileset)
    were not all put in place. The message names the files and says whether the earlier ones are
    intact. An OSError carrying the failed write's errno and the directory as its filename, so a
    full disk reads as one (the tune's resume hint, exit status 28)."""

    def __init__(self, message: str, code: int, directory: object):
        super().__init__(code, message, str(directory))
        self.message = message

    def __str__(self) -> str:  # the message alone, not OSError's "[Errno 28] ...: 'dir'"
        return self.message

    @property
    def exit_code(self) -> int:
        return DiskFullError.exit_code if self.errno in NO_SPACE_ERRNOS else 1


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


class TrainspeedWarning(UserWarning):
    """A warning trainspeed gives on purpose. Shown as one line, `trainspeed: warning: ...`,
    not as Python's `file.py:397: UserWarning: ...` followed by the source line (which names
    our code, not the user's); other warnings keep Python's format."""


def warn(message: str) -> None:
    warnings.warn(message, TrainspeedWarning, stacklevel=2)


def _format_warning(message, category, filename, lineno, line=None, _python=warnings.formatwarning):
    if isinstance(category, type) and issubclass(category, TrainspeedWarning):
        return f"trainspeed: warning: {message}\n"
    return _python(message, category, filename, lineno, line)


if not getattr(warnings.formatwarning, "_trainspeed", False):
    _format_warning._trainspeed = True  # type: ignore[attr-defined]
    warnings.formatwarning = _format_warning
