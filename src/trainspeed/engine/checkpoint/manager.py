"""CheckpointManager: when to save, where, how many to keep, and which one to resume from.

Directory layout:

    checkpoints/
      step-00001200.pt        payload (torch.save of the state dict)
      step-00001200.pt.json   manifest: sha256, bytes, step, metrics (written after the payload)
      step-00001500.dcp/      a sharded (FSDP) checkpoint: one DCP directory, every rank's
                              shards plus rank 0's trainspeed.json marker (see sharded.py)
      latest                  name of the newest complete checkpoint (moved only after a write)

Both kinds live side by side: listing, keep-N pruning and "newest intact" resume treat a
checkpoint directory like a checkpoint file (its marker plays the manifest's part).

Events (dicts with a "type" key plus flat fields; the checkpoint's step is "ckpt_step", since
the Monitor stamps its own "step" on every event record) go to `on_event`, always on the
thread that calls the manager (the training thread): events produced by the background
writer or mirror are queued and delivered at the next should_save/save/poll/wait/close.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainspeed.engine.checkpoint.async_save import AsyncSaver
from trainspeed.engine.checkpoint.async_save import to_host
from trainspeed.engine.checkpoint.atomic import (
    atomic_save,
    atomic_write_bytes,
    cleanup_stale_temps,
    load_verified,
    manifest_path,
)
from trainspeed.engine.checkpoint.sharded import (
    ShardedIO,
    ShardedState,
    dcp_reason,
    publish,
    remove_tree,
)
from trainspeed.engine.checkpoint.listing import (  # noqa: F401 - re-exported (public names)
    NAME_RE,
    CheckpointInfo,
    checkpoint_name,
    find_resumable,
    list_checkpoints,
    verify_checkpoint,
)
from trainspeed.engine.checkpoint.space import SpaceCheck, disk_full, make_directory, no_space, state_bytes
from trainspeed.errors import CheckpointError, ConfigError, DiskFullError, warn

EventFn = Callable[[dict[str, Any]], None]
LATEST = "latest"


@dataclass(slots=True)
class SaveResult:
    path: Path
    """Final path of the checkpoint (complete once the write finished)."""
    step: int
    blocking_s: float
    """Time the caller was blocked: waiting for the previous write + host copy (async) or the
    whole write (sync)."""
    write_s: float | None
    """Seconds the write took; None for an async save (reported later in the event)."""
    async_save: bool
    skipped: bool = False
    """True when this step was already saved and nothing was written."""


def _metric_value(value: Any) -> float | None:
    try:
        value = float(value)  # a 0-d tensor becomes a float here (a sync if it is on a GPU)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class CheckpointManager:
    """Periodic, atomic, optionally asynchronous and mirrored checkpoints with retention."""

    def __init__(
        self,
        directory: str | Path,
        *,
        keep_last: int | None = 3,
        keep_best: int = 0,
        best_metric: str = "val_loss",
        best_mode: str = "min",
        every_steps: int | None = None,
        every_minutes: float | None = None,
        save_final: bool = True,
        async_save: bool = True,
        mirror: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_event: EventFn | None = None,
        writer: bool = True,
    ):
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 0):
            raise ConfigError(f"checkpoint.keep_last must be an int >= 0 (0: keep all), got {keep_last!r}")
        if not isinstance(keep_best, int) or keep_best < 0:
            raise ConfigError(f"checkpoint.keep_best must be an int >= 0, got {keep_best!r}")
        if best_mode not in ("min", "max"):
            raise ConfigError(f"checkpoint.best_mode must be 'min' or 'max', got {best_mode!r}")
        if every_steps is not None and (not isinstance(every_steps, int) or every_steps < 1):
            raise ConfigError(f"checkpoint.every_steps must be an int >= 1 or null, got {every_steps!r}")
        if every_minutes is not None and not (every_minutes > 0):
            raise ConfigError(f"checkpoint.every_minutes must be > 0 or null, got {every_minutes!r}")
        self.directory = Path(directory)
        make_directory(self.directory)  # a full disk, a read-only mount: one line, not a traceback
        self.keep_last, self.keep_best = keep_last, keep_best
        self.best_metric, self.best_mode = best_metric, best_mode
        self.every_steps, self.every_minutes = every_steps, every_minutes
        self.save_final = save_final
        self.async_save = async_save
        self._clock = clock
        self._last_save_t = clock()
        self._last_step: int | None = None
        self.on_event = on_event
        """Receives every event dict, on the thread that calls the manager (settable)."""
        self._pending: collections.deque[dict[str, Any]] = collections.deque()
        self._lock = threading.Lock()  # retention / pointer updates (writer thread vs caller)
        self._saver = AsyncSaver() if async_save else None
        self.space = SpaceCheck(self.directory)
        self._sharded_pending: tuple[Path, Path, int, int | None] | None = None
        self.skipped: list[str] = []
        """Human-readable notes about corrupt checkpoints that find_resumable passed over."""
        self.corrupt: set[Path] = set()
        self.writer = writer
        """False on data-parallel ranks > 0: they write only their shards of sharded saves and
        never touch pointers, retention or other processes' temp files."""
        self.sharded: ShardedIO | None = None
        """Set (on every rank) to save and load sharded checkpoints (save_sharded)."""
        self.mirror = None
        self.mirror_url = mirror
        if mirror and writer:
            from trainspeed.engine.checkpoint.mirror import Mirror

            self.mirror = Mirror(mirror, emit=self._pending.append)
        for stale in (cleanup_stale_temps(self.directory) if writer else []):
            self._emit({"type": "warning", "kind": "checkpoint_temp_removed", "path": str(stale)})

    @classmethod
    def from_config(cls, cfg: Any, run_dir: str | Path | None = None, *,
                    on_event: EventFn | None = None,
                    clock: Callable[[], float] = time.monotonic,
                    writer: bool = True) -> CheckpointManager:
        """Build from a CheckpointConfig (or any object with its attributes)."""
        directory = getattr(cfg, "dir", None)
        if directory is None:
            if run_dir is None:
                raise ConfigError("checkpoint.dir is not set and there is no run directory; set checkpoint.dir")
            directory = Path(run_dir) / "checkpoints"
        return cls(directory, keep_last=cfg.keep_last, keep_best=cfg.keep_best,
                   best_metric=cfg.best_metric, best_mode=cfg.best_mode,
                   every_steps=cfg.every_steps, every_minutes=cfg.every_minutes,
                   save_final=cfg.save_final, async_save=cfg.async_save,
                   mirror=getattr(cfg, "mirror", None), clock=clock, on_event=on_event,
                   writer=writer)

    # -- events ---------------------------------------------------------------------------------
    def _emit(self, event: dict[str, Any]) -> None:
        self._pending.append(event)

    def poll(self) -> None:
        """Deliver queued events to on_event on the calling thread."""
        while self._pending:
            event = self._pending.popleft()
            if self.on_event is not None:
                self.on_event(event)

    # -- when -----------------------------------------------------------------------------------
    def should_save(self, step: int) -> bool:
        """True when a periodic checkpoint is due at this step boundary. Cheap; call every step."""
        if self._pending:
            self.poll()
        if step == self._last_step:
            return False
        if self.every_steps is not None and step > 0 and step % self.every_steps == 0:
            return True
        return (self.every_minutes is not None
                and self._clock() - self._last_save_t >= self.every_minutes * 60.0)

    # -- save -----------------------------------------------------------------------------------
    def path_for(self, step: int) -> Path:
        return self.directory / checkpoint_name(step)

    def save(self, state: dict[str, Any], step: int, metrics: dict[str, Any] | None = None,
             *, reason: str = "periodic") -> SaveResult:
        """Save `state` as the checkpoint of `step`. Async: returns after the host copy.

        `reason` ("periodic", "final", "signal", "crash", ...) is recorded in the manifest and
        the event. A second save of the same step is skipped (SaveResult.skipped).
        """
        path = self.path_for(step)
        clean = self._start_save(step, metrics)
        if clean is None:
            return self._skipped(path, step)
        self._check_space(state)
        if self._saver is not None:
            def job(host: Any, timing: Any) -> None:
                write_s, event = self._write(host, step, clean, is_async=True, reason=reason)
                self._emit({**event, "blocking_s": timing.blocking_s, "waited_s": timing.waited_s})

            timing = self._saver.submit(state, job)
            self.poll()
            return SaveResult(path=path, step=step, blocking_s=timing.blocking_s, write_s=None,
                              async_save=True)
        t0 = time.perf_counter()
        try:
            write_s, event = self._write(state, step, clean, is_async=False, reason=reason)
        except DiskFullError:
            self.poll()
            raise
        except Exception as exc:
            self.poll()
            raise CheckpointError(f"saving checkpoint {path} failed: {exc!r}") from exc
        blocking_s = time.perf_counter() - t0
        self._emit({**event, "blocking_s": blocking_s, "waited_s": 0.0})
        self.poll()
        return SaveResult(path=path, step=step, blocking_s=blocking_s, write_s=write_s, async_save=False)

    def _start_save(self, step: int, metrics: dict[str, Any] | None) -> dict[str, Any] | None:
        """Record a save of `step` as started and return its JSON-safe metrics, or None when
        this step was saved already (a final save right after a periodic one)."""
        if step == self._last_step:
            return None
        self._last_save_t = self._clock()
        self._last_step = step
        return {k: _metric_value(v) for k, v in (metrics or {}).items()}

    def _check_space(self, state: Any) -> None:
        note = self.space.before_save(state) if self.writer else None
        if note is not None:
            warn(note)  # on the console too: the save after this one may not fit
            self._emit({"type": "warning", "kind": "low_disk_space", "path": str(self.directory),
                        "needed_bytes": self.space.last_bytes, "message": note})

    def _skipped(self, path: Path, step: int) -> SaveResult:
        self.poll()
        return SaveResult(path=path, step=step, blocking_s=0.0, write_s=0.0,
                          async_save=self.async_save, skipped=True)

    def save_sharded(self, state: ShardedState, step: int, metrics: dict[str, Any] | None = None,
                     *, reason: str = "periodic") -> SaveResult:
        """Save a sharded checkpoint directory of `step`. A collective: every rank calls it at
        the same step. Each rank writes its shards; rank 0 (the writer) then writes the
        marker, renames the directory into place, moves `latest` and prunes. Async: returns
        once this rank's shards are copied to CPU memory."""
        io = self.sharded
        if io is None:
            raise CheckpointError("save_sharded needs manager.sharded (a ShardedIO) to be set")
        path = self.directory / checkpoint_name(step, suffix=io.suffix)
        clean = self._start_save(step, metrics)
        if clean is None:
            return self._skipped(path, step)
        is_async = self.async_save and not io.synchronous  # DeepSpeed writes before it returns
        t0 = time.perf_counter()
        self._wait_sharded()  # the previous save (all of it, on this rank) finishes before the next starts
        waited_s = time.perf_counter() - t0
        tmp = self.directory / f".{path.name}.tmp-{io.tag}"
        needed = (self.space.last_bytes or state_bytes(state.tensors) * io.world_size
                  or getattr(io, "estimate_bytes", lambda: 0)() or None)
        then = None
        if self.writer:
            rest = to_host(state.rest)  # the training thread keeps mutating the live RNG/sampler
            meta = {"step": step, "metrics": clean, "reason": reason, "world_size": io.world_size,
                    **io.marker_meta()}

            def then() -> None:
                write_s, event = self._publish_sharded(rest, tmp, path, meta, t0)
                blocked = blocking_s if is_async else time.perf_counter() - t0
                self._emit({**event, "async": is_async, "blocking_s": blocked,
                            "waited_s": waited_s})

        blocking_s = 0.0
        try:
            # Async: `then` runs in the background, after every rank's write; it reads
            # blocking_s (set below) only once the shards are written, long after this returns.
            io.start_save(state.tensors, tmp, async_save=is_async, then=then)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            raise self._sharded_failed(exc, tmp, path, step, needed) from exc
        self._sharded_pending = (tmp, path, step, needed) if is_async else None
        blocking_s = time.perf_counter() - t0
        self.poll()
        return SaveResult(path=path, step=step, blocking_s=blocking_s,
                          write_s=None if is_async else blocking_s, async_save=is_async)

    def _sharded_failed(self, exc: BaseException, tmp: Path, path: Path, step: int,
                        needed: int | None) -> CheckpointError:
        """A sharded save that failed: its temp directory is removed (it holds the space a
        full disk needs back), the error named in one line, "sharded" only for a sharded run."""
        io = self.sharded
        what = ("DeepSpeed checkpoint" if io.format == "deepspeed"
                else "sharded checkpoint" if io.world_size > 1 else "checkpoint")
        if isinstance(exc, DiskFullError) or no_space(exc, self.directory):
            # free space as the failed write left it, measured before the temp directory goes
            err: CheckpointError = disk_full(self.directory, needed, what=what, cause=exc)
        elif isinstance(exc, CheckpointError):
            err = exc
        else:
            err = CheckpointError(f"saving {what} {path} failed: {dcp_reason(exc)}")
        if self.writer:
            remove_tree(tmp, missing_ok=True)
        self._emit({"type": "warning", "kind": "checkpoint_failed", "ckpt_step": step,
                    "path": str(path), "error": str(err)})
        self.poll()
        return err

    def _publish_sharded(self, rest: dict[str, Any], tmp: Path, path: Path, meta: dict[str, Any],
                         t0: float) -> tuple[float, dict[str, Any]]:
        try:
            marker = publish(tmp, path, rest, meta, fmt=self.sharded.format,
                             required=self.sharded.required_file)
            with self._lock:
                self.corrupt.discard(path)
                atomic_write_bytes((path.name + "\n").encode(), self.directory / LATEST)
                write_s = time.perf_counter() - t0
                pruned = self._prune()
        except BaseException as exc:
            remove_tree(tmp, missing_ok=True)
            self._emit({"type": "warning", "kind": "checkpoint_failed", "ckpt_step": meta["step"],
                        "path": str(path), "error": str(exc) if isinstance(exc, DiskFullError) else repr(exc)})
            raise
        if self.mirror is not None:
            self._emit({"type": "warning", "kind": "mirror_skipped", "path": str(path),
                        "error": "checkpoint.mirror copies single-file checkpoints only"})
        return write_s, {"type": "checkpoint", "kind": "save", "ckpt_step": meta["step"],
                         "reason": meta["reason"], "path": str(path), "write_s": write_s,
                         "bytes": self.space.saved(marker["bytes"]), "sharded": True,
                         "world_size": meta["world_size"], "metrics": meta["metrics"],
                         "pruned": [p.name for p in pruned]}

    def _write(self, state: Any, step: int, metrics: dict[str, float | None],
               *, is_async: bool, reason: str) -> tuple[float, dict[str, Any]]:
        """Write payload + manifest, move `latest`, prune, queue the mirror copy.

        Returns the write time and the (incomplete) checkpoint event for the caller to emit.
        """
        t0 = time.perf_counter()
        path = self.path_for(step)
        try:
            manifest = atomic_save(state, path, meta={"step": step, "metrics": metrics, "reason": reason})
            with self._lock:
                self.corrupt.discard(path)  # rewritten whole: an ordinary checkpoint again
                # The pointer moves only after payload and manifest are durable.
                atomic_write_bytes((path.name + "\n").encode(), self.directory / LATEST)
                write_s = time.perf_counter() - t0
                pruned = self._prune()
        except BaseException as exc:
            self._emit({"type": "warning", "kind": "checkpoint_failed", "ckpt_step": step,
                        "path": str(path), "error": str(exc) if isinstance(exc, DiskFullError) else repr(exc)})
            raise
        if self.mirror is not None:
            self.mirror.submit(path)
            for old in pruned:
                self.mirror.delete(old.name)
        return write_s, {"type": "checkpoint", "kind": "save", "ckpt_step": step, "reason": reason, "path": str(path),
                         "write_s": write_s, "bytes": self.space.saved(manifest["bytes"]), "async": is_async,
                         "metrics": metrics, "pruned": [p.name for p in pruned]}

    # -- retention ------------------------------------------------------------------------------
    def _prune(self) -> list[Path]:
        infos = [i for i in list_checkpoints(self.directory) if i.path not in self.corrupt]
        keep: set[Path] = set()
        if not self.keep_last:  # 0 or None: keep every checkpoint
            keep.update(i.path for i in infos)
        else:
            keep.update(i.path for i in infos[-self.keep_last:])
        keep.update(self.best_checkpoints(infos))
        latest = self.latest()
        if latest is not None:
            keep.add(latest)
        pruned = []
        for info in infos:
            if info.path in keep:
                continue
            if info.path.is_dir():
                remove_tree(info.path)
            else:
                # Payload first: an orphan manifest is ignored, an orphan payload looks corrupt.
                info.path.unlink(missing_ok=True)
                manifest_path(info.path).unlink(missing_ok=True)
            pruned.append(info.path)
        return pruned

    def best_checkpoints(self, infos: list[CheckpointInfo] | None = None) -> list[Path]:
        """The keep_best checkpoints with the best `best_metric`, best first."""
        if self.keep_best <= 0:
            return []
        infos = list_checkpoints(self.directory) if infos is None else infos
        scored = [(v, i.path) for i in infos
                  if (v := _metric_value(i.metrics.get(self.best_metric))) is not None]
        scored.sort(key=lambda vp: vp[0], reverse=self.best_mode == "max")
        return [p for _, p in scored[: self.keep_best]]

    # -- find / load ----------------------------------------------------------------------------
    def list_checkpoints(self) -> list[CheckpointInfo]:
        return list_checkpoints(self.directory)

    def latest(self) -> Path | None:
        """The checkpoint the `latest` pointer names (None if absent or dangling)."""
        try:
            name = (self.directory / LATEST).read_text().strip()
        except OSError:
            return None
        path = self.directory / name
        return path if NAME_RE.match(name) and path.exists() else None

    def find_resumable(self, on_skip: Callable[[Path, str], None] | None = None) -> Path | None:
        """Newest intact checkpoint (checksum verified); corrupt ones are noted and skipped."""
        self.wait()

        def skip(path: Path, why: str) -> None:
            self.corrupt.add(path)
            self.skipped.append(why)
            warn(f"skipping corrupt checkpoint: {why}")
            self._emit({"type": "warning", "kind": "checkpoint_corrupt", "path": str(path), "error": why})
            if on_skip is not None:
                on_skip(path, why)

        found = find_resumable(self.directory, on_skip=skip)
        self.poll()
        return found

    def resolve_resume(self, resume: str | Path | None, *, auto_resume: bool = False) -> Path | None:
        """checkpoint.resume (a file, a directory, "latest", an fsspec URL) / auto_resume (the
        newest intact here, else on the mirror) as a checkpoint path; None: start fresh
        (restore.py)."""
        from trainspeed.engine.checkpoint.restore import resolve

        found = resolve(self.directory, resume, auto_resume=auto_resume, mirror=self.mirror_url,
                        find_local=self.find_resumable, skipped=self.skipped, say=self.writer)
        self.poll()
        return found

    def load(self, path: str | Path | None = None, map_location: Any = "cpu") -> dict[str, Any]:
        """Load a verified checkpoint (default: the newest intact one)."""
        if path is None:
            path = self.find_resumable()
            if path is None:
                raise CheckpointError(f"no intact checkpoint in {self.directory}")
        if Path(path).is_dir():
            raise CheckpointError(
                f"{path} is a sharded (DCP) checkpoint: load it with ShardedIO.load (the Trainer "
                "does), or convert it to one file with torch.distributed.checkpoint.format_utils."
                "dcp_to_torch_save")
        return load_verified(path, map_location=map_location)

    # -- lifecycle ------------------------------------------------------------------------------
    def wait(self) -> None:
        """Block until the background write (and mirror copies) finished; raise write errors."""
        try:
            if self.sharded is not None:
                self._wait_sharded()
            if self._saver is not None:
                self._saver.wait()
            if self.mirror is not None:
                self.mirror.wait()
        finally:
            self.poll()

    def _wait_sharded(self) -> None:
        """The pending async sharded save; a failure is named (a full disk in one line) and
        its temp directory removed, as for a save that failed at once."""
        pending, self._sharded_pending = self._sharded_pending, None
        try:
            self.sharded.wait()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            if pending is None:
                raise
            raise self._sharded_failed(exc, *pending) from exc

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self.sharded is not None:
                self.sharded.close()
            if self.mirror is not None:
                self.mirror.close()
                self.mirror = None
            self.poll()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
