"""Crash-safe checkpoint files: never a partial file under a final name.

A save writes the payload to a hidden temporary file in the destination directory, hashes it
while writing, flushes and fsyncs it, renames it over the final name (os.replace is atomic on
POSIX), fsyncs the directory so the rename itself is durable, and only then writes a small JSON
manifest `<name>.json` ({"sha256", "bytes", ...}) the same way. A payload is trusted only when
its manifest exists and the checksum matches, so a file cut short by a crash, a full disk or a
bad copy is detected on load instead of surfacing as a confusing unpickling error.

Loading uses `torch.load(weights_only=True)`: a checkpoint from elsewhere must not run code.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from trainspeed.engine.checkpoint.space import disk_full, no_space, says_no_space, state_bytes
from trainspeed.errors import CheckpointError, DiskFullError

MANIFEST_SUFFIX = ".json"
MANIFEST_SCHEMA = 1
_CHUNK = 8 << 20
# Hidden temp names carry the writer's pid so a stale file from a killed process can be told
# apart from one a live process is still writing.
_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]+$")


def manifest_path(path: str | Path) -> Path:
    """The manifest beside a payload: `step-00000100.pt` -> `step-00000100.pt.json`."""
    path = Path(path)
    return path.with_name(path.name + MANIFEST_SUFFIX)


def temp_path(path: Path) -> Path:
    """A hidden temp sibling of `path` naming its writer's pid: cleanup_stale_temps removes it
    once that process is gone (killed mid-write)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def fsync_dir(directory: str | Path) -> None:
    """Make a rename/creation in `directory` durable (POSIX; a no-op where unsupported)."""
    try:
        fd = os.open(str(directory), os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


class _HashingWriter:
    """File-like wrapper that hashes and counts bytes as torch.save streams them."""

    def __init__(self, f):
        self._f = f
        self.sha = hashlib.sha256()
        self.nbytes = 0
        self.error: OSError | None = None
        """The file's own write error: torch's zip writer swallows it and reports only
        `unexpected pos ...`, which says nothing of a full disk."""

    def write(self, data) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.nbytes += view.nbytes
        try:
            return self._f.write(view)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self._f.flush()


def _replace_durably(tmp: Path, final: Path) -> None:
    os.replace(tmp, final)
    fsync_dir(final.parent)


def atomic_write_bytes(data: bytes, path: str | Path) -> None:
    """Write small files (manifests, pointers) with the same temp -> fsync -> rename protocol."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _replace_durably(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and says_no_space(exc):
            raise disk_full(path.parent, len(data), cause=exc) from exc
        raise


def atomic_save(obj: Any, path: str | Path, *, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """torch.save `obj` to `path` atomically and durably, then write its checksum manifest.

    `meta` (JSON-serializable: step, metrics, ...) is stored in the manifest. Returns the
    manifest dict. On any error the temporary file is removed and nothing changes at `path`.
    """
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    writer = None
    try:
        with open(tmp, "wb") as f:
            writer = _HashingWriter(f)
            torch.save(obj, writer)
            f.flush()
            os.fsync(f.fileno())  # the payload must be on disk before the rename makes it visible
        _replace_durably(tmp, path)
    except BaseException as exc:
        full = None
        if isinstance(exc, Exception) and not isinstance(exc, DiskFullError) and (
                says_no_space(getattr(writer, "error", None)) or no_space(exc, path.parent)):
            # free space as it was when the write failed, before the temp file gives it back
            full = disk_full(path.parent, max(state_bytes(obj), getattr(writer, "nbytes", 0)), cause=exc)
        tmp.unlink(missing_ok=True)
        if full is not None:
            raise full from exc
        raise
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "file": path.name,
        "sha256": writer.sha.hexdigest(),
        "bytes": writer.nbytes,
        "t_wall": time.time(),
        **(meta or {}),
    }
    # Written AFTER the payload is durable: a manifest always describes a complete file.
    try:
        atomic_write_bytes(json.dumps(manifest, indent=1, default=str).encode(), manifest_path(path))
    except BaseException as exc:
        # A payload without its manifest is no checkpoint --auto-resume takes, and on a full disk
        # it held the space the next save needs (a 10 MB step-2.pt stayed on a tmpfs whose last
        # page went to it): nothing changes at `path`, as for a failed payload.
        path.unlink(missing_ok=True)
        manifest_path(path).unlink(missing_ok=True)
        if isinstance(exc, DiskFullError):  # the checkpoint's size, not the manifest's 200 bytes
            raise disk_full(path.parent, writer.nbytes, cause=exc.__cause__ or exc) from exc
        raise
    return manifest


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of payload `path`, or CheckpointError saying why it cannot be used."""
    path = Path(path)
    mpath = manifest_path(path)
    if not mpath.exists():
        earlier = _earlier(path)
        raise CheckpointError(
            f"{path}: checksum manifest {mpath.name} is missing, so the file cannot be verified by it "
            "(the save was interrupted, or the file was copied without its manifest). "
            f"Copy {mpath.name} beside it, or resume from the file by name (--resume {path}: the "
            "CRC-32s the file records verify it)"
            + (f", or from an earlier checkpoint{earlier}." if earlier else ".")
        )
    return read_json_record(mpath, "manifest", key="sha256", key_type=str, schema=MANIFEST_SCHEMA)


def read_json_record(path: Path, what: str, *, key: str, key_type: type, schema: int) -> dict[str, Any]:
    """A small JSON file we wrote (a manifest, a marker): valid JSON, a dict holding `key` of
    `key_type`, and a schema this version reads; else CheckpointError saying which."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: {what} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get(key), key_type):
        raise CheckpointError(f"{path}: {what} has no '{key}' field; got {data!r:.200}")
    if int(data.get("schema", 1)) > schema:
        raise CheckpointError(f"{path}: {what} schema {data['schema']} is newer than this "
                              f"trainspeed reads ({schema}); upgrade trainspeed.")
    return data


def sha256_file(path: str | Path) -> tuple[str, int]:
    sha = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
            n += len(chunk)
    return sha.hexdigest(), n


def _earlier(path: Path) -> str:
    """` (--resume DIR/step-N.pt)`: the newest other checkpoint beside `path` that has its
    manifest, or "" when there is none (a message said "use an earlier checkpoint" and named none)."""
    try:
        others = sorted((p for p in path.parent.glob("step-*.pt") if p.name < path.name and manifest_path(p).exists()),
                        reverse=True)
    except OSError:
        return ""
    return f" (--resume {others[0]})" if others else ""


def verify(path: str | Path) -> dict[str, Any]:
    """Check that `path` is complete and unmodified; return its manifest or raise CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file does not exist")
    manifest = read_manifest(path)
    size = path.stat().st_size
    expected = manifest.get("bytes")
    if isinstance(expected, int) and size != expected:
        what = "truncated" if size < expected else "has extra bytes"
        raise CheckpointError(
            f"{path}: file {what}: {size} bytes on disk, manifest says {expected}. "
            f"It was cut short by a crash or an incomplete copy; use an earlier checkpoint{_earlier(path)}."
        )
    digest, _ = sha256_file(path)
    if digest != manifest["sha256"]:
        raise CheckpointError(
            f"{path}: checksum mismatch (sha256 {digest[:16]}... on disk, manifest says "
            f"{manifest['sha256'][:16]}...). The file is corrupt; use an earlier checkpoint{_earlier(path)}."
        )
    return manifest


def load_verified(path: str | Path, map_location: Any = "cpu", *, verified: bool = False) -> Any:
    """Verify the checksum of `path` (unless the caller just did: `verified`, e.g. by the file's
    own CRC-32s in without_manifest.py), then torch.load it with weights_only=True."""
    import pickle

    import torch

    path = Path(path)
    if not verified:
        verify(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path}: refused to load: it contains objects other than tensors and plain "
            f"containers, and weights_only loading never runs code from a file "
            f"({_unpickler_reason(str(exc))})"
        ) from exc
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        raise CheckpointError(f"{path}: could not be read as a torch checkpoint: {exc}") from exc


def _unpickler_reason(message: str) -> str:
    """The one informative line of torch's long weights_only refusal message."""
    for line in message.splitlines():
        if "WeightsUnpickler error" in line:
            return line.strip()
    return message.strip().splitlines()[0] if message.strip() else "unknown reason"


def cleanup_stale_temps(directory: str | Path) -> list[Path]:
    """Remove temp files left by writers that no longer run (killed mid-save). Returns them."""
    removed: list[Path] = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        m = _TEMP_RE.match(entry.name)
        if not m:
            continue
        pid = int(m.group("pid"))
        if pid == os.getpid() or pid_alive(pid):
            continue
        if entry.is_dir():  # a sharded checkpoint's temp directory
            import shutil

            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def is_temp_name(name: str) -> bool:
    return _TEMP_RE.match(name) is not None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:  # pragma: no cover
        return False
    return True
