"""trainspeed.fileset: files staged beside their final names, put in place together or not at
all. The tune's own story (a full disk between best.yaml and tune.json) is tests/tune/test_output_set.py."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainspeed.errors import OutputSetError, TrainspeedWarning
from trainspeed.fileset import JOURNAL, complete_pending, staged

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
        if Path(dst).name == JOURNAL:  # the commit's journal goes in place first
            return real(src, dst)
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


# A writer killed (kill -9) between two of its commit's renames: the journal it put in place
# before the first names the rest, and the next reader or writer finishes them.
_KILLED_MID_COMMIT = """
import os, signal, sys
from pathlib import Path
from trainspeed.fileset import JOURNAL, staged
real, renames = os.replace, []
def replace(src, dst):
    real(src, dst)
    if Path(dst).name != JOURNAL:
        renames.append(dst)
        if len(renames) == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # after a.txt, before b.txt
os.replace = replace
d = Path(sys.argv[1])
with staged(d, ("a.txt", "b.txt", "c.txt"), what="the outputs", again="write them again") as files:
    files.write_text(d / "a.txt", "2")
    files.write_text(d / "b.txt", "2")
"""


def _killed_mid_commit(directory):
    proc = subprocess.run([sys.executable, "-c", _KILLED_MID_COMMIT, str(directory)], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr


def test_a_commit_killed_between_its_renames_is_finished_by_the_next_set(tmp_path):
    _write_set(tmp_path, {"a.txt": "1", "b.txt": "1", "c.txt": "1"})
    _killed_mid_commit(tmp_path)
    left = _files(tmp_path)  # a mixed set, its journal and b.txt's staged file
    assert {n: t for n, t in left.items() if not n.startswith(".")} == {"a.txt": "2", "b.txt": "1", "c.txt": "1"}
    assert json.loads(left[JOURNAL])["remove"] == ["c.txt"]
    assert [t for n, t in left.items() if n.startswith(".b.txt.tmp-")] == ["2"]
    with pytest.warns(TrainspeedWarning, match="finished putting b.txt in place"):
        assert complete_pending(tmp_path) == ["b.txt"]
    # the killed set, whole: its b.txt in place, the earlier set's c.txt (not in it) removed,
    # no journal and no staged file left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]
    assert _files(tmp_path) == {"a.txt": "2", "b.txt": "2"}
    assert complete_pending(tmp_path) == []  # done once
    _killed_mid_commit(tmp_path)
    with pytest.warns(TrainspeedWarning, match="finished putting b.txt"):
        _write_set(tmp_path, {"c.txt": "3"})  # the next set finishes it first, then lands itself
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]


def test_a_journal_whose_writer_still_runs_is_left_alone(tmp_path):
    staged_name = ".a.txt.tmp-1-0123abcd"
    (tmp_path / staged_name).write_text("pid 1's")
    (tmp_path / JOURNAL).write_text(json.dumps({"pid": 1, "place": {"a.txt": staged_name}, "remove": []}))
    assert complete_pending(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([JOURNAL, staged_name])


def test_a_journal_names_files_of_its_own_directory_only(tmp_path):
    """The journal is ours, but a name with a path in it is not followed out of the directory."""
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's")
    d = tmp_path / "out"
    d.mkdir()
    (d / JOURNAL).write_text(json.dumps({"pid": 2 ** 22 + 1, "place": {"../outside.txt": ".x.tmp-5-00"},
                                          "remove": ["../outside.txt"]}))
    assert complete_pending(d) == []
    assert outside.read_text() == "the user's" and not (d / JOURNAL).exists()


def test_the_journal_failing_to_write_changes_nothing(tmp_path, monkeypatch):
    """The journal is written like a staged file: a full disk there leaves the earlier set."""
    import trainspeed.fileset as fileset

    _write_set(tmp_path, {"a.txt": "1", "b.txt": "1"})
    real = fileset._write_synced

    def write(tmp, text, newline):
        if JOURNAL in tmp.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(tmp, text, newline)

    monkeypatch.setattr(fileset, "_write_synced", write)
    with pytest.raises(OutputSetError, match=f"{JOURNAL} could not be written") as info:
        _write_set(tmp_path, {"a.txt": "2", "b.txt": "2"})
    assert info.value.exit_code == 28
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]
    assert _files(tmp_path) == {"a.txt": "1", "b.txt": "1"}


def test_reading_best_yaml_finishes_a_tune_killed_between_its_renames(tmp_path):
    """`trainspeed run --with DIR/best.yaml` reads the set a killed tune left: the new best.yaml,
    not the earlier one beside the new patch."""
    from trainspeed.patches.plan import Plan, load_plan, save_plan

    save_plan(Plan(command=["python", "train.py"], settings={"loader.num_workers": 0}), tmp_path / "best.yaml")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    staged_name = f".best.yaml.tmp-{dead}-0123abcd"
    save_plan(Plan(command=["python", "train.py"], settings={"loader.num_workers": 2}), tmp_path / staged_name)
    (tmp_path / JOURNAL).write_text(json.dumps({"pid": int(dead), "place": {"best.yaml": staged_name},
                                                "remove": ["best.patch"]}))
    with pytest.warns(TrainspeedWarning, match="finished putting best.yaml in place"):
        assert load_plan(tmp_path / "best.yaml").settings == {"loader.num_workers": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.yaml"]
