"""Copy each finished checkpoint to a second location, in the background.

The destination is a local directory path, a `file://` URL, or any fsspec URL (`s3://bucket/x`,
`gs://...`). Local destinations use shutil with the same temp -> rename protocol as the primary
copy; remote ones go through fsspec (imported lazily; `pip install 'trainspeed[all]'`). The
payload is uploaded before its manifest, so a manifest at the destination means a complete copy.
Failures are reported as events and never crash training.
"""

from __future__ import annotations

import os
import queue
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from trainspeed.engine.checkpoint.atomic import fsync_dir, manifest_path
from trainspeed.errors import require

EmitFn = Callable[[dict[str, Any]], None]


def _local_dir(url: str) -> Path | None:
    """The local directory a URL names, or None for a remote URL."""
    if "://" not in url:
        return Path(url)
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return Path(parsed.netloc + parsed.path) if parsed.netloc else Path(parsed.path)
    return None


class Mirror:
    """Background copier: `submit(path)` queues a checkpoint (payload + manifest) for copying."""

    def __init__(self, url: str, *, emit: EmitFn | None = None):
        self.url = url.rstrip("/")
        self._emit = emit or (lambda event: None)
        self._local = _local_dir(self.url)
        self._fs = None
        self._root = ""
        if self._local is None:
            fsspec = require("fsspec", extra="all", feature=f"checkpoint mirror to {url}")
            self._fs, self._root = fsspec.core.url_to_fs(self.url)
        self._queue: queue.Queue[tuple[str, Path] | None] = queue.Queue()
        # Daemon: a stuck network upload must not keep a finished process alive; close() joins.
        self._thread = threading.Thread(target=self._loop, name="trainspeed-ckpt-mirror", daemon=True)
        self._thread.start()
        self.copied = 0
        self.failed = 0
        # Names pruned here after their copy was queued: keep_last removes a checkpoint from the
        # run's directory before a slow mirror reached it, and its copy is then skipped, not
        # reported as a failure (the mirror would delete it again right after).
        self._pruned: set[str] = set()

    # -- public ------------------------------------------------------------------------------
    def submit(self, path: str | Path) -> None:
        path = Path(path)
        self._pruned.discard(path.name)  # written again (a resumed run re-saving a step)
        self._queue.put(("copy", path))

    def delete(self, name: str) -> None:
        """Remove a pruned checkpoint from the mirror too (best effort); a copy of it still
        queued is skipped."""
        self._pruned.add(name)
        self._queue.put(("delete", Path(name)))

    def wait(self) -> None:
        """Block until every queued copy finished (or failed)."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    # -- worker ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                op, path = item
                start = time.perf_counter()
                try:
                    if op == "copy" and path.name in self._pruned:
                        continue  # pruned before the mirror reached it: nothing to keep
                    if op == "copy":
                        self._copy(path)
                        self.copied += 1
                        self._emit({"type": "checkpoint", "kind": "mirror", "path": str(path),
                                    "dest": self._dest(path.name), "write_s": time.perf_counter() - start})
                    else:
                        self._delete(path.name)
                        self._pruned.discard(path.name)  # no copy of it is queued behind its delete
                except FileNotFoundError as exc:
                    if op != "copy" or path.name not in self._pruned:
                        self._failed(op, path, exc)
                    # else pruned while being copied: the queued delete removes the part copied
                except Exception as exc:  # never crash training over a mirror
                    self._failed(op, path, exc)
            finally:
                self._queue.task_done()

    def _failed(self, op: str, path: Path, exc: BaseException) -> None:
        self.failed += 1
        self._emit({"type": "warning", "kind": "mirror_failed", "op": op,
                    "path": str(path), "dest": self.url, "error": repr(exc)})

    def _dest(self, name: str) -> str:
        if self._local is not None:
            return str(self._local / name)
        return f"{self._root.rstrip('/')}/{name}"

    def _copy(self, path: Path) -> None:
        files = [path, manifest_path(path)]  # payload first: a manifest marks a complete copy
        if self._local is not None:
            self._local.mkdir(parents=True, exist_ok=True)
            for src in files:
                final = self._local / src.name
                tmp = final.with_name(f".{src.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
                try:
                    shutil.copyfile(src, tmp)
                    with open(tmp, "rb+") as f:
                        os.fsync(f.fileno())
                    os.replace(tmp, final)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
            fsync_dir(self._local)
            return
        fs = self._fs  # set whenever the destination is not local
        fs.makedirs(self._root, exist_ok=True)
        for src in files:
            fs.put_file(str(src), self._dest(src.name))

    def _delete(self, name: str) -> None:
        for n in (name + ".json", name):  # manifest first: an orphan payload is never trusted
            if self._local is not None:
                (self._local / n).unlink(missing_ok=True)
            elif self._fs.exists(self._dest(n)):
                self._fs.rm_file(self._dest(n))
