"""trainspeed.fileset: files staged beside their final names, put in place together or not at
all. The tune's own story (a full disk between best.yaml and tune.json) is tests/tune/test_output_set.py."""

from __future__ import annotations

import errno
import os

import pytest

from trainspeed.errors import OutputSetError, TrainspeedWarning
from trainspeed.fileset import staged

pytestmark = pytest.mark.timeout(30)
NAMES = ("a.txt", "b.txt", "c.txt")


def _files(directory):
    return {p.name: p.read_text() for p in sorted(directory.iterdir()) if p.is_file()}


def _write_set(directory, texts):
    with staged(directory, NAMES, what="the outputs", again="write them again") as files:
        for name, text in texts.items():
            files.write_text(directory / name, text)


def test_a_set_lands_whole_and_removes_the_names_it_did_not_write(tmp_path):
    _write_set(tmp_path, {"a.txt": "1", "b.txt": "1", "c.txt": "1"})
    _write_set(tmp_path, {"a.txt": "2", "b.txt": "2"})
    assert _files(tmp_path) == {"a.txt": "2", "b.txt": "2"}


def test_files_staged_by_a_writer_killed_before_its_commit_are_swept_by_the_next_set(tmp_path):
    """A tune killed (kill -9) while staging leaves hidden temp files naming its pid; the next
    set staged in that directory removes them, and leaves those of a writer still running."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / f".a.txt.tmp-{dead}-0123abcd").write_text("half of a killed tune's a.txt")
    (tmp_path / ".b.txt.tmp-1-0123abcd").write_text("pid 1 runs")
    _write_set(tmp_path, {"a.txt": "1"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".b.txt.tmp-1-0123abcd", "a.txt"]


def test_an_error_inside_the_block_changes_nothing(tmp_path):
    _write_set(tmp_path, {"a.txt": "1", "b.txt": "1"})
    with pytest.raises(RuntimeError):
        with staged(tmp_path, NAMES, what="the outputs", again="write them again") as files:
            files.write_text(tmp_path / "a.txt", "2")
            raise RuntimeError("a bug while rendering the tables")
    assert _files(tmp_path) == {"a.txt": "1", "b.txt": "1"}  # and no staged temp file left


def test_a_name_outside_the_set_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a file of this set"):
        with staged(tmp_path, NAMES, what="the outputs", again="write them again") as files:
            files.write_text(tmp_path / "sub" / "a.txt", "x")
    assert _files(tmp_path) == {}


def test_an_unwritable_directory_says_so(tmp_path, monkeypatch):
    def refused(fd):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    _write_set(tmp_path, {"a.txt": "1"})
    monkeypatch.setattr(os, "fsync", refused)
    with pytest.raises(OutputSetError) as info:
        _write_set(tmp_path, {"a.txt": "2", "b.txt": "2"})
    assert info.value.errno == errno.EACCES and info.value.exit_code == 1
    assert str(info.value).endswith(f"the earlier a.txt there is intact. Make {tmp_path} writable, then write them again")
    assert _files(tmp_path) == {"a.txt": "1"}


@pytest.mark.parametrize("failing", [1, 2])
def test_a_rename_failing_says_what_landed(tmp_path, monkeypatch, failing):
    """A rename takes no space, but a mount can go away between two of them: after the first,
    the message must not claim the earlier set is intact."""
    _write_set(tmp_path, {"a.txt": "1", "b.txt": "1"})
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == failing:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    said = ("were not updated: a.txt could not be put in place .*the earlier a.txt, b.txt there are intact"
            if failing == 1 else "are mixed: a.txt was updated, but b.txt could not be put in place")
    with pytest.raises(OutputSetError, match=said):
        _write_set(tmp_path, {"a.txt": "2", "b.txt": "2"})
    landed = {"a.txt": "1" if failing == 1 else "2", "b.txt": "1"}
    assert _files(tmp_path) == landed  # the staged files removed, not left hidden


def test_an_earlier_file_that_cannot_be_removed_is_named(tmp_path):
    (tmp_path / "c.txt").mkdir()  # not a file: unlink refuses it
    with pytest.warns(TrainspeedWarning, match="c.txt is left from an earlier set of the outputs"):
        _write_set(tmp_path, {"a.txt": "2"})
    assert _files(tmp_path) == {"a.txt": "2"}
