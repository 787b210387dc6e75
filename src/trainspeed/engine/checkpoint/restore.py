"""Which checkpoint a run resumes from: checkpoint.resume (a file, a directory, "latest" or an
fsspec URL) or checkpoint.auto_resume (the newest intact local one, else the newest intact one
on checkpoint.mirror), and the error when every checkpoint there is unusable.

A checkpoint restored from a mirror is copied into the run's checkpoint directory (payload,
then manifest, each through a temp name) and verified there like any local checkpoint: a
damaged copy is skipped for the next older one. Auto-resume never starts a run over silently
when checkpoints exist but none is usable: it stops and says what to do instead.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainspeed.engine.checkpoint.atomic import manifest_path
from trainspeed.engine.checkpoint.listing import NAME_RE, find_resumable, list_checkpoints, verify_checkpoint
from trainspeed.engine.checkpoint.mirror import _local_dir
from trainspeed.engine.checkpoint.sharded import is_sharded_checkpoint, verify_dir
from trainspeed.engine.checkpoint.without_manifest import verify_named
from trainspeed.errors import CheckpointError, require

SkipFn = Callable[[Path, str], None]


def is_url(spec: str) -> bool:
    """A remote fsspec URL (s3://, gs://, memory://, ...); file:// and plain paths are local."""
    return "://" in spec and _local_dir(spec) is None


def _remote(url: str) -> tuple[Any, str]:
    fsspec = require("fsspec", extra="all", feature=f"restoring a checkpoint from {url}")
    return fsspec.core.url_to_fs(url)


def remote_names(url: str) -> list[str]:
    """Checkpoint names at a mirror URL, newest step first (only those with a manifest)."""
    fs, root = _remote(url)
    try:
        entries = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    names = {str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries}
    found = [n for n in names if NAME_RE.match(n) and n.endswith(".pt") and n + ".json" in names]
    return sorted(found, key=lambda n: int(NAME_RE.match(n).group(1)), reverse=True)


def download(url: str, name: str, directory: Path) -> Path:
    """Copy checkpoint `name` (payload, then manifest) from a mirror URL into `directory`."""
    fs, root = _remote(url)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / name
    for src_name, dest in ((name, final), (name + ".json", manifest_path(final))):
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            fs.get_file(f"{root.rstrip('/')}/{src_name}", str(tmp))
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return final


def from_url(url: str, directory: Path, on_skip: SkipFn | None = None) -> Path | None:
    """checkpoint.resume=URL: one checkpoint (`.../step-N.pt`) or the newest intact one under a
    mirror URL, copied into `directory` and verified."""
    base, _, last = url.rstrip("/").rpartition("/")
    if NAME_RE.match(last):
        names, url = [last], base
    else:
        names = remote_names(url)
    for name in names:
        try:
            path = download(url, name, directory)
        except FileNotFoundError as exc:
            raise CheckpointError(f"checkpoint.resume={url}/{name}: not found there ({exc})") from exc
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as exc:
            if on_skip is not None:
                on_skip(path, str(exc))
    return None


def unusable(directory: Path, skipped: list[str], mirror: str | None) -> CheckpointError:
    where = f"{directory}" + (f" and the mirror {mirror}" if mirror else "")
    reasons = "; ".join(s.splitlines()[0] for s in skipped[:3]) + ("; ..." if len(skipped) > 3 else "")
    return CheckpointError(
        f"--auto-resume: every checkpoint in {where} is unusable ({len(skipped)} damaged: {reasons}). "
        "Training did not start. Either start fresh in a new run directory (run.name=NEW, without "
        "--auto-resume), or name a checkpoint to resume with --resume PATH")


def resolve(directory: Path, resume: str | Path | None, *, auto_resume: bool, mirror: str | None,
            find_local: Callable[[], Path | None], skipped: list[str], say: bool = True) -> Path | None:
    """The checkpoint to resume (None: start fresh). `find_local` is the manager's newest-intact
    search (it records what it skips in `skipped`)."""
    def skip(path: Path, why: str) -> None:
        skipped.append(why)

    if resume is None:
        if not auto_resume:
            return None
        found = find_local()
        if found is None and mirror and is_url(mirror):
            found = from_url(mirror, directory, on_skip=skip)
            if found is not None and say:
                print(f"trainspeed: no intact checkpoint in {directory}; restored {found.name} from "
                      f"the mirror {mirror}", file=sys.stderr, flush=True)
        if found is None and (skipped or list_checkpoints(directory)):
            raise unusable(directory, skipped, mirror)
        return found
    spec = str(resume)
    if spec == "latest":
        found = find_local()
        if found is None:
            raise CheckpointError(f"checkpoint.resume='latest' but {directory} holds no intact checkpoint")
        return found
    if is_url(spec):
        found = from_url(spec, directory, on_skip=skip)
        if found is None:
            raise CheckpointError(f"checkpoint.resume={spec!r}: no intact checkpoint there"
                                  + (f" ({skipped[-1]})" if skipped else ""))
        return found
    return _named(Path(_local_dir(spec) or spec), spec, skip)


def _named(path: Path, spec: str, skip: SkipFn) -> Path:
    """The checkpoint a local checkpoint.resume names: a sharded directory (verified), the
    newest intact one in a directory of them, or a file (verified when it is loaded). Named
    files need no manifest beside them (without_manifest.py): a copied one is read itself."""
    if is_sharded_checkpoint(path):
        verify_dir(path)  # a clear error now rather than a failed load on every rank
        return path
    if path.is_dir():
        reasons: list[str] = []

        def note(damaged: Path, why: str) -> None:
            reasons.append(why)
            skip(damaged, why)

        found = find_resumable(path, on_skip=note, check=verify_named)
        if found is None:
            why = (f"the newest: {reasons[0].splitlines()[0]}" if reasons
                   else "it holds no step-N.pt file, .dcp or .ds folder")
            raise CheckpointError(f"checkpoint.resume={spec!r}: no intact checkpoint in that directory ({why})")
        return found
    if not path.is_file():
        raise CheckpointError(f"checkpoint.resume={spec!r}: no such file or directory")
    return path


@dataclass(slots=True)
class ResumeTarget:
    """The checkpoint a local checkpoint.resume names, found and verified before the run."""

    path: Path
    skipped: list[str]
    """Why each newer checkpoint beside it was passed over (a directory was named)."""


def check_resume_spec(resume: str | None) -> ResumeTarget | None:
    """Before a run directory is made: a local checkpoint.resume that does not exist, holds no
    intact checkpoint or names a damaged one is an error now, not after the run directory (its
    config, env and event files) was written. None: not a local path (URL, "latest", unset)."""
    if resume is None or str(resume) == "latest" or is_url(str(resume)):
        return None
    spec = str(resume)
    path = Path(_local_dir(spec) or spec)
    if not path.exists():
        raise CheckpointError(f"checkpoint.resume={spec!r}: no such file or directory")
    skipped: list[str] = []
    found = _named(path, spec, lambda _path, why: skipped.append(why))
    if found.is_file() and found == path:  # a named file: _named leaves its check to the load
        verify_named(found)
    return ResumeTarget(path=found, skipped=skipped)
