"""Files that land together or not at all: a tune's best.yaml, best.patch and tables.

Each file written alone (fileio.atomic_write_text: temp file, rename) is whole, but a set of
them written one after another is not: a disk that fills between two writes leaves a new
best.yaml beside the best.patch and tune.json of an earlier tune into the same directory, a
set no tune made, which the user may apply. So each file of the set is first staged as a hidden
temp sibling (the same directory: its rename cannot cross a filesystem), written and fsynced;
only when all are staged are they renamed into place (a rename needs no space). Then the set's
names that this set does not write (an earlier tune's best.patch, where this one made none) are
removed, so nothing of the earlier set looks current, and the directory is fsynced.

When a staged write fails, every staged file is removed and the files already there stay as
they were, byte for byte; OutputSetError says which files were not updated, that the earlier
ones are intact, and what to do. Any other error inside the `with` also removes the staged
files and changes nothing.

Staged files take the checkpoints' temp names (engine/checkpoint/atomic.temp_path, naming the
writer's pid), so those of a tune killed before its commit are swept by the next staged() in
that directory (cleanup_stale_temps). A crash (kill -9, power loss) between two of the renames
is rolled forward: before the first rename, a journal (JOURNAL, itself written, fsynced and
renamed into place) names every staged file and the names to remove; the commit deletes it
last. A journal found later means a commit that was cut: complete_pending() finishes it (each
rename whose staged file is still there, then the removals; both are idempotent), so the set
lands whole, the new one. The next staged() in that directory and load_plan (the reader of
best.yaml) call it first. A crash before the journal is in place leaves the earlier set, and
staged files that the next staged() sweeps.

    with staged(out, ("best.yaml", "tune.json"), what="the tune's outputs", again="...") as files:
        files.write_text(out / "tune.json", text)
        save_plan(plan, out / "best.yaml", write=files.write_text)  # the writers take `write`
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path
from typing import Iterable, Iterator

from trainspeed.errors import NO_SPACE_ERRNOS, OutputSetError, warn

_UNWRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
JOURNAL = ".fileset-commit.json"
"""A commit in progress in a directory: {"pid", "place": {name: staged file's name}, "remove": [names]}."""


def _listed(names: Iterable[str]) -> str:
    return ", ".join(names)


class FileSet:
    """The files of one set, staged beside their final names until commit()."""

    def __init__(self, directory: str | os.PathLike, names: Iterable[str], *, what: str, again: str,
                 keep: Iterable[str] = ()):
        self.directory = Path(directory)
        self.names = tuple(names)
        """Every name the set may hold: those not written this time are removed at commit()."""
        self.keep = frozenset(keep)
        """Names never removed: a file of the user's own that shares a name of the set."""
        self.what = what
        """What the set is, for the messages: "the tune's outputs"."""
        self.again = again
        """What to do once the cause is fixed: "run the same tune command again ..."."""
        self._staged: dict[str, Path] = {}  # name -> its temp sibling, in the order written

    def write_text(self, path: str | os.PathLike, text: str, *, newline: str | None = None) -> Path:
        """Stage `text` for `path` (one of the set's names in its directory): written and fsynced
        now, put in place by commit(). The same signature as fileio.atomic_write_text."""
        final = Path(path)
        if final.name not in self.names or final.parent.resolve() != self.directory.resolve():
            raise ValueError(f"{final} is not a file of this set ({_listed(self.names)} in {self.directory})")
        from trainspeed.engine.checkpoint.atomic import temp_path

        self._unstage(final.name)  # written twice: the last text wins
        # the checkpoints' temp name (it names this process): a set staged by a tune killed
        # mid-write is swept by the next one's staged() (cleanup_stale_temps)
        tmp = temp_path(self.directory / final.name)
        try:
            _write_synced(tmp, text, newline)
        except BaseException as exc:
            tmp.unlink(missing_ok=True)  # a half-written temp holds the space the rerun needs
            if isinstance(exc, OSError):
                raise self._not_written(final.name, exc) from exc
            raise
        self._staged[final.name] = tmp
        return final

    def commit(self) -> list[Path]:
        """Put every staged file in place, then remove the set's other names; the paths placed."""
        from trainspeed.engine.checkpoint.atomic import fsync_dir

        placed: list[str] = []
        remove = [n for n in self.names if n not in self._staged and n not in self.keep]
        journal = self._journal(remove)
        for name, tmp in list(self._staged.items()):
            try:
                os.replace(tmp, self.directory / name)
            except OSError as exc:  # not a full disk (a rename takes no space): a directory in the way, a mount gone
                journal.unlink(missing_ok=True)  # nothing a later complete_pending() could finish
                if not placed:  # nothing changed yet
                    raise self._not_written(name, exc, "put in place") from exc
                self.discard()
                raise self._mixed(placed, name, exc) from exc
            del self._staged[name]
            placed.append(name)
        for name in remove:
            try:
                (self.directory / name).unlink(missing_ok=True)
            except OSError as exc:  # the new set is in place: say so, do not fail it
                warn(f"{self.directory / name} is left from an earlier set of {self.what} ({exc.strerror or exc}); "
                     "it is not one of the files just written: delete it")
        journal.unlink(missing_ok=True)
        fsync_dir(self.directory)  # the renames, removals and the journal's end survive a power loss
        return [self.directory / name for name in placed]

    def _journal(self, remove: list[str]) -> Path:
        """Write, fsync and put in place the journal of this commit (see JOURNAL): from here on
        a crash is finished by complete_pending(), not undone. A failure to write it (a full
        disk) changes nothing: OutputSetError, as for a staged file."""
        from trainspeed.engine.checkpoint.atomic import fsync_dir, temp_path

        path = self.directory / JOURNAL
        entry = {"pid": os.getpid(), "place": {n: t.name for n, t in self._staged.items()}, "remove": remove}
        tmp = temp_path(path)
        try:
            _write_synced(tmp, json.dumps(entry), None)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise self._not_written(JOURNAL, exc) from exc
        fsync_dir(self.directory)  # the journal is on disk before the first rename
        return path

    def discard(self) -> None:
        """Remove every staged file; the directory's files stay as they were."""
        for name in list(self._staged):
            self._unstage(name)

    def _unstage(self, name: str) -> None:
        tmp = self._staged.pop(name, None)
        if tmp is not None:
            tmp.unlink(missing_ok=True)

    def _fix(self, exc: OSError) -> tuple[int, str]:
        """(errno to report, what to do first) for a failed write."""
        from trainspeed.engine.checkpoint.space import no_space  # its rules tell a full disk (ENOSPC, < 1 MiB free)

        if no_space(exc, self.directory):
            return exc.errno if exc.errno in NO_SPACE_ERRNOS else errno.ENOSPC, "free space on that disk"
        if exc.errno in _UNWRITABLE:
            return exc.errno, f"make {self.directory} writable"
        return exc.errno or errno.EIO, "fix what stopped the write"

    def _not_written(self, name: str, exc: OSError, done: str = "written") -> OutputSetError:
        code, fix = self._fix(exc)
        self.discard()
        kept = [n for n in self.names if (self.directory / n).is_file()]
        earlier = (f"the earlier {_listed(kept)} there {'are' if len(kept) > 1 else 'is'} intact" if kept
                   else "no earlier ones were there, and nothing is left half-written")
        return OutputSetError(
            f"{self.what} in {self.directory} were not updated: {name} could not be {done} "
            f"({exc.strerror or exc}), so none of {_listed(self.names)} was changed; {earlier}. "
            f"{fix[0].upper()}{fix[1:]}, then {self.again}", code, self.directory)

    def _mixed(self, placed: list[str], name: str, exc: OSError) -> OutputSetError:
        code, fix = self._fix(exc)
        were = "were" if len(placed) > 1 else "was"
        return OutputSetError(
            f"{self.what} in {self.directory} are mixed: {_listed(placed)} {were} updated, but "
            f"{name} could not be put in place ({exc.strerror or exc}); the others there are from an "
            f"earlier set. {fix[0].upper()}{fix[1:]}, then {self.again}", code, self.directory)


@contextlib.contextmanager
def staged(directory: str | os.PathLike, names: Iterable[str], *, what: str, again: str,
           keep: Iterable[str] = ()) -> Iterator[FileSet]:
    """A FileSet committed when the block ends without an error, discarded when it raises."""
    from trainspeed.engine.checkpoint.atomic import cleanup_stale_temps

    files = FileSet(directory, names, what=what, again=again, keep=keep)
    files.directory.mkdir(parents=True, exist_ok=True)
    complete_pending(files.directory)  # an earlier commit cut between its renames: finished first
    cleanup_stale_temps(files.directory)  # an earlier writer's staged files, killed before commit
    try:
        yield files
    except BaseException:
        files.discard()
        raise
    files.commit()


def _write_synced(tmp: Path, text: str, newline: str | None) -> None:
    """Create `tmp` (0o600 and exclusive, as tempfile.mkstemp made them) with `text`, fsynced:
    on disk before any rename, so a crash after the renames keeps whole files."""
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w",
                   encoding="utf-8", newline=newline) as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def complete_pending(directory: str | os.PathLike) -> list[str]:
    """Finish a commit that a crash cut between its renames (its JOURNAL is still there): put
    each staged file it names that is still there in place, remove the names it removes, then
    the journal. Returns the names put in place. Nothing to do without a journal, or while the
    process that wrote it still runs (its commit is under way). A journal that cannot be read
    (cut short before its rename: never, it is renamed whole) is left, with a warning."""
    from trainspeed.engine.checkpoint.atomic import pid_alive, fsync_dir

    directory = Path(directory)
    path = directory / JOURNAL
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        pid, place, remove = int(entry["pid"]), dict(entry["place"]), list(entry["remove"])
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warn(f"{path} names a commit of files that could not be read back ({exc}); the files there may "
             "be from two sets: rerun the command that wrote them")
        return []
    if pid != os.getpid() and pid_alive(pid):
        return []
    placed = []
    for name, staged_name in place.items():
        if Path(name).name != name or Path(staged_name).name != staged_name:
            continue  # only names in this directory: a journal is ours, but never trusted further
        tmp = directory / staged_name
        if tmp.is_file():
            os.replace(tmp, directory / name)
            placed.append(name)
    for name in remove:
        if Path(name).name == name:
            (directory / name).unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    fsync_dir(directory)
    if placed:
        warn(f"finished putting {_listed(placed)} in place in {directory}: the process writing them "
             f"(pid {pid}) ended between their renames")
    return placed


__all__ = ["FileSet", "JOURNAL", "complete_pending", "staged"]
