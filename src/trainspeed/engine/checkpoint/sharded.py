"""Sharded checkpoints: one torch.distributed.checkpoint (DCP) directory per step.

Under FSDP no rank holds the whole model, so no rank writes it alone: every rank writes its own
shards with `torch.distributed.checkpoint` (DCP), and rank 0 adds the small non-tensor state.

    checkpoints/step-00000006.dcp/
      __0_0.distcp __1_0.distcp   each rank's shards of the model and optimizer state (DCP)
      .metadata                   DCP's index of every shard (rank 0, after all ranks wrote)
      trainer_state.pt            counters, sampler position, scheduler, scaler, RNG, config
                                  digest: trainspeed's usual checkpoint dict without model and
                                  optimizer (rank 0; loads with weights_only=True)
      trainspeed.json             marker: step, reason, metrics, world size, the size of every
                                  file and trainer_state.pt's sha256. Written LAST.

Atomic: all of it goes into `.step-00000006.dcp.tmp-<pid>-<hex>/` (the pid is rank 0's, so a
stale one is recognised and removed like a stale temp file); rank 0 writes the marker only
after DCP reports that every rank finished (its future completes after the coordinator wrote
`.metadata`, which it does only once all ranks returned their write results), then renames the
directory. A directory under a final name therefore always carries a marker, and one whose
files do not match it (a truncated shard, a lost file) is "corrupt" and skipped by auto-resume.

Async: `dcp.async_save` copies the shards to CPU memory on the calling thread (DCP's stager)
and writes them from a background thread, so training continues while they are written. Its
collectives run on a dedicated gloo process group (from that thread, concurrently with the
training's own collectives, which must not share a group with them). The next save, and the
end of fit, wait for the previous one.

Resuming on another number of ranks works: DCP reshards on load (each rank reads the parts of
the saved shards that overlap its new shard), and a single process loads the whole tensors.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainspeed.engine.checkpoint.atomic import (
    atomic_save,
    atomic_write_bytes,
    fsync_dir,
    is_temp_name,
    load_verified,
    read_json_record,
    verify,
)
from trainspeed.errors import CheckpointError

SUFFIX = ".dcp"
DEEPSPEED_SUFFIX = ".ds"
"""A DeepSpeed checkpoint directory (deepspeed_io.py): the same marker and atomic publish, with
DeepSpeed's own files (engine.save_checkpoint) where DCP's shards are here."""
MARKER = "trainspeed.json"
STATE_FILE = "trainer_state.pt"
DCP_METADATA = ".metadata"
MARKER_SCHEMA = 1


def is_sharded_checkpoint(path: str | Path) -> bool:
    """A DCP checkpoint directory (by its name or its marker), as opposed to a directory of
    checkpoints or a single-file checkpoint."""
    path = Path(path)
    return path.is_dir() and (path.name.endswith((SUFFIX, DEEPSPEED_SUFFIX)) or (path / MARKER).exists())


def temp_tag() -> str:
    """`<pid>-<hex>` for this process's temp directories (rank 0 broadcasts its own)."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def dcp_reason(exc: BaseException) -> str:
    """One line saying why a DCP call failed: DCP's CheckpointException (a BaseException)
    wraps each rank's own exception; the first of those is the informative part."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, (inner, _) = next(iter(sorted(failures.items())))
        return f"rank {rank}: {dcp_reason(inner)}"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else 'no message'}"


def read_marker(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    marker = path / MARKER
    if not marker.exists():
        raise CheckpointError(
            f"{path}: sharded checkpoint has no {MARKER} marker, so it is incomplete (rank 0 "
            "writes the marker last, after every rank's shards). Use an earlier checkpoint.")
    return read_json_record(marker, "marker", key="files", key_type=dict, schema=MARKER_SCHEMA)


def verify_dir(path: str | Path) -> dict[str, Any]:
    """Check that a sharded checkpoint is complete: every file the marker lists exists with its
    recorded size, and trainer_state.pt matches its sha256. (Shards are checked by size, not
    hashed: hashing every rank's shards would read the whole model back on rank 0.)"""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: sharded checkpoint directory does not exist")
    marker = read_marker(path)
    files: dict[str, Any] = marker["files"]
    required = marker.get("required", DCP_METADATA)
    if required not in files or STATE_FILE not in files:
        raise CheckpointError(f"{path}: marker lists neither {required} nor {STATE_FILE}")
    for name, size in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{path}: {name} is missing (the marker lists it); the "
                                  "checkpoint is incomplete, use an earlier one")
        if isinstance(size, int) and f.stat().st_size != size:
            raise CheckpointError(f"{path}: {name} has {f.stat().st_size} bytes, the marker says "
                                  f"{size}; it was cut short or modified, use an earlier checkpoint")
    verify(path / STATE_FILE)  # its own checksum manifest (trainer_state.pt.json)
    return marker


def remove_tree(path: Path, *, missing_ok: bool = False) -> None:
    """Delete a checkpoint directory so that it disappears at once: renamed to a temp name
    first (an interrupted delete leaves a stale temp, never a half-deleted checkpoint)."""
    trash = path.with_name(f".{path.name}.tmp-{temp_tag()}")
    try:
        os.replace(path, trash)
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


@dataclass(slots=True)
class ShardedState:
    """What make_state returns under FSDP: the state dicts DCP saves (every rank), and the
    non-tensor rest that rank 0 writes to trainer_state.pt (build_checkpoint without model
    and optimizer)."""

    tensors: dict[str, Any]
    rest: dict[str, Any]


def publish(tmp: Path, final: Path, rest: dict[str, Any], meta: dict[str, Any], *,
            fmt: str = "dcp", required: str = DCP_METADATA) -> dict[str, Any]:
    """Rank 0, after every rank's shards are written: trainer_state.pt, then the marker, then
    the rename to the final name. Returns the marker. `required` is the file without which the
    writer (DCP, DeepSpeed) did not finish; files in subdirectories are listed by relative path."""
    state_manifest = atomic_save(rest, tmp / STATE_FILE, meta={"step": meta.get("step")})
    files = {p.relative_to(tmp).as_posix(): p.stat().st_size for p in sorted(tmp.rglob("*"))
             if p.is_file() and p.name != MARKER and not is_temp_name(p.name)}
    if required not in files:
        raise CheckpointError(f"{tmp}: the {fmt} save finished without writing {required}")
    marker = {"schema": MARKER_SCHEMA, "format": fmt, "required": required, **meta, "files": files,
              "bytes": sum(files.values()), "state_sha256": state_manifest["sha256"],
              "t_wall": time.time()}
    atomic_write_bytes(json.dumps(marker, indent=1, default=str).encode(), tmp / MARKER)
    if final.exists():  # the same step saved again (e.g. a crash save after a resume)
        remove_tree(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    return marker


class ShardedIO:
    """Saves and loads a (possibly FSDP-sharded) model and optimizer with DCP.

    `process_group` is the gloo group the (async) save's collectives run on; None in a single
    process or when only loading. `saver` is False for runs that only load DCP checkpoints
    (a single process or DDP resuming a sharded checkpoint)."""

    suffix, format, required_file = SUFFIX, "dcp", DCP_METADATA  # see CheckpointManager.save_sharded
    synchronous = False  # checkpoint.async_save applies

    def __init__(self, model: Any, optimizer: Any, *, process_group: Any = None,
                 world_size: int = 1, tag: str | None = None) -> None:
        self.model, self.optimizer = model, optimizer
        self.process_group = process_group
        self.world_size = world_size
        self.tag = tag or temp_tag()
        self._pending: concurrent.futures.Future | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    # -- save -----------------------------------------------------------------------------------
    def marker_meta(self) -> dict[str, Any]:
        """What the marker records beyond step, reason and world size."""
        return {}

    def state_dicts(self) -> dict[str, Any]:
        """Sharded (DTensor) model and optimizer state dicts, keyed by parameter name: no
        gather, each rank holds only its shards."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optimizer": optim_sd}

    def start_save(self, tensors: dict[str, Any], tmp: Path, *, async_save: bool,
                   then: Callable[[], Any] | None = None) -> None:
        """Every rank: write this rank's shards into `tmp`. Async: returns once they are copied
        to CPU memory. `then` (rank 0) runs after every rank finished: in the background when
        async, here otherwise. Call `wait` before the next save."""
        import torch.distributed.checkpoint as dcp

        if self._pending is not None:
            raise CheckpointError("a sharded save is still pending; call wait() first")
        if async_save:
            future = dcp.async_save(tensors, checkpoint_id=str(tmp), process_group=self.process_group)
            if then is not None:
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix="trainspeed-dcp-publish")
                done = future
                future = self._pool.submit(lambda: (done.result(), then())[1])
            self._pending = future
            return
        dcp.save(tensors, checkpoint_id=str(tmp), process_group=self.process_group)
        if then is not None:
            then()

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def wait(self) -> Any:
        """Block until the pending save finished (on this rank); raise its error."""
        future, self._pending = self._pending, None
        if future is None:
            return None
        try:
            return future.result()
        except (CheckpointError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            raise CheckpointError(f"sharded checkpoint save failed: {dcp_reason(exc)}") from exc

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    # -- load -----------------------------------------------------------------------------------
    def load(self, path: str | Path) -> dict[str, Any]:
        """Load model and optimizer shards into the live objects (DCP reshards when the world
        size differs); returns trainer_state.pt (counters, RNG, ...) for restore_checkpoint."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        path = Path(path)
        marker = verify_dir(path)
        if marker.get("format", "dcp") != "dcp":
            raise CheckpointError(
                f"{path} was saved by {marker['format']} (distributed.strategy="
                f"{marker['format']}); resume it with that strategy, or start this run fresh "
                "(checkpoint.resume=null, checkpoint.auto_resume=false). Its zero_to_fp32.py "
                "writes the model's weights as one fp32 state dict for other uses")
        saved_ws = marker.get("world_size", "?")
        rest = load_verified(path / STATE_FILE)
        if self.optimizer is None:
            raise CheckpointError(f"{path}: loading a sharded checkpoint needs the optimizer")
        try:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            tensors = {"model": model_sd, "optimizer": optim_sd}
            distributed = dist.is_available() and dist.is_initialized()
            dcp.load(tensors, checkpoint_id=str(path), process_group=self.process_group,
                     no_dist=not distributed)
            set_state_dict(self.model, self.optimizer, model_state_dict=tensors["model"],
                           optim_state_dict=tensors["optimizer"])
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            raise CheckpointError(
                f"{path}: could not load the sharded checkpoint saved by {saved_ws} rank(s) into "
                f"this run of {self.world_size} rank(s): {dcp_reason(exc)}. "
                "DCP reshards model and optimizer across world sizes, so this usually means "
                "the model or optimizer differs from the one that saved it.") from exc
        return rest
