"""A tune's outputs land as one set (tune/session.output_set, trainspeed/fileset.py): a disk
that fills between two of its writes leaves the earlier tune's best.yaml, best.patch and
tune.json byte for byte as they were, never a new best.yaml beside an old best.patch; a tune
that writes fewer files removes the earlier ones it did not write. The full disk is a real
small tmpfs where this runs as root, and a write failing on its Nth file everywhere."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from trainspeed.errors import OutputSetError
from trainspeed.patches.targets import Targets
from trainspeed.tune.result import Row, TuneResult
from trainspeed.tune.script_facts import ScriptFacts

pytestmark = pytest.mark.timeout(60)
SCRIPT_SET = ["best.yaml", "best.patch", "code_change.md", "tune.json", "tune.md", "tune.html"]


def _result(best: dict) -> TuneResult:
    rows = [Row(knob="threads", setting=str(v), settings={"threads": v}, verdict="faster", speedup=1.3)
            for v in best.values()] or [Row(knob="threads", setting="1", verdict="slower", speedup=0.8)]
    return TuneResult(ablation=rows, combination=[], best_settings=best, final=None, baseline_cost_s=1e-3,
                      trials_run=3, trials_reused=0, elapsed_s=10.0)


def _script_tune(out: Path, best: dict) -> None:
    """write_script_outputs of a tune of ./train.py whose winners are `best`."""
    from trainspeed.tune.script_session import write_script_outputs

    facts = ScriptFacts(targets=Targets(script=str(Path("train.py").resolve())), cores=2)
    write_script_outputs(["python", "train.py"], _result(best), out, facts, runner=None)


def _files(out: Path) -> dict[str, bytes]:
    """Every file under `out`, hidden temp files included, with its bytes."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    (tmp_path / "train.py").write_text("import torch\nprint('hi')\n")
    return tmp_path


def _fail_nth_fsync(monkeypatch, n: int) -> dict:
    """The Nth staged file's fsync fails with ENOSPC (where a full disk reports a write at the
    latest: its data could not be put on the disk); the others go through."""
    real, seen = os.fsync, {"calls": 0}

    def fsync(fd):
        seen["calls"] += 1
        if seen["calls"] == n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


@pytest.mark.parametrize("n", range(1, len(SCRIPT_SET) + 1))
def test_a_write_failing_on_the_nth_file_leaves_the_earlier_set_as_it_was(script, monkeypatch, n):
    out = script / "out"
    _script_tune(out, {"threads": 1})
    before = _files(out)
    assert sorted(before) == sorted(SCRIPT_SET)
    with monkeypatch.context() as m:
        _fail_nth_fsync(m, n)
        with pytest.raises(OutputSetError) as info:
            _script_tune(out, {"threads": 2})
    assert _files(out) == before  # byte for byte, and no staged temp file left
    err = info.value
    assert err.errno == errno.ENOSPC and err.exit_code == 28 and err.filename == str(out)
    text = str(err)
    assert f"the tune's outputs in {out} were not updated: {SCRIPT_SET[n - 1]} could not be written" in text
    assert "No space left on device" in text and "none of best.yaml, deepspeed_config.json, best.patch" in text
    assert f"the earlier {', '.join(SCRIPT_SET)} there are intact" in text
    assert text.endswith("Free space on that disk, then run the same tune command again, from the same "
                         f"directory, with the same --out: its finished trials ({out / 'tune.jsonl'}) are "
                         "reused, not measured again")
    _script_tune(out, {"threads": 2})  # space freed: the new set, whole
    after = _files(out)
    assert sorted(after) == sorted(SCRIPT_SET) and all(after[f] != before[f] for f in ("best.yaml", "tune.json"))
    assert json.loads(after["tune.json"])["best_settings"] == {"threads": 2}
    assert b"threads: 2" in after["best.yaml"] and after["best.patch"] != before["best.patch"]


def test_a_tune_with_fewer_files_removes_the_earlier_ones_it_did_not_write(script):
    """Nothing won the second tune: the first's best.patch and code_change.md must not stay
    beside its best.yaml (a `git apply` would apply what this tune did not keep)."""
    out = script / "out"
    _script_tune(out, {"threads": 1})
    _script_tune(out, {})
    assert sorted(_files(out)) == ["best.yaml", "tune.html", "tune.json", "tune.md"]
    assert json.loads((out / "tune.json").read_text())["patch"] is None


def test_the_scripts_own_deepspeed_config_in_the_out_is_never_removed(script):
    """`--out .` beside the script's own deepspeed_config.json: a tune with no ZeRO winner writes no
    tuned copy of that name, and must not delete the user's file as an earlier tune's."""
    from trainspeed.tune.script_facts import DeepSpeedConfigFile
    from trainspeed.tune.script_session import write_script_outputs

    own = script / "deepspeed_config.json"
    own.write_text('{"train_micro_batch_size_per_gpu": 8}\n')
    facts = ScriptFacts(targets=Targets(script=str(script / "train.py")), cores=2,
                        deepspeed_config=DeepSpeedConfigFile(option="--deepspeed_config", path=str(own)))
    write_script_outputs(["python", "train.py", "--deepspeed_config", "deepspeed_config.json"], _result({}),
                         Path("."), facts, runner=None)
    assert own.read_text() == '{"train_micro_batch_size_per_gpu": 8}\n' and (script / "tune.json").is_file()


@pytest.mark.parametrize("n", range(1, 5))
def test_a_recipe_tune_lands_its_outputs_as_a_set_too(base_config, tmp_path, monkeypatch, n):
    from trainspeed.config import load_config
    from trainspeed.tune.session import write_outputs

    cfg, out = load_config(base_config), tmp_path / "out"
    won = {"precision.mode": "bf16-mixed"}
    write_outputs(cfg, _result({}), out)
    before = _files(out)
    with monkeypatch.context() as m:
        _fail_nth_fsync(m, n)
        with pytest.raises(OutputSetError, match="were not updated"):
            write_outputs(cfg, _won(won), out)
    assert _files(out) == before
    write_outputs(cfg, _won(won), out)
    assert sorted(_files(out)) == ["best.yaml", "tune.html", "tune.json", "tune.md"]
    assert "bf16-mixed" in (out / "best.yaml").read_text() and _files(out)["tune.json"] != before["tune.json"]


def _won(best: dict) -> TuneResult:
    result = _result({})
    result.best_settings = dict(best)
    return result


def test_a_full_disk_under_the_outputs_says_what_was_kept_and_how_to_resume(script, monkeypatch, capsys):
    """Through the CLI: exit status 28, the resume command, the files not updated; no traceback."""
    import trainspeed.tune.script_session as script_session
    from trainspeed.cli.main import main

    out = Path("runs/tune-train-threads")
    _script_tune(out, {"threads": 1})
    before = _files(out)

    def tune_then_fill(command, out_dir, options, **kwargs):
        _fail_nth_fsync(monkeypatch, 3)
        _script_tune(Path(out_dir), {"threads": 2})

    monkeypatch.setattr(script_session, "run_script_tune", tune_then_fill)
    (out / "tune.jsonl").write_text("")  # the trials the rerun reuses
    code = main(["tune", "--knobs", "threads", "--budget", "2m", "--", "python", "train.py"])
    err = capsys.readouterr().err
    assert code == 28, err
    assert "Resume with:\n    trainspeed tune --out runs/tune-train-threads --knobs threads" in err, err
    assert "OutputSetError: the tune's outputs in runs/tune-train-threads were not updated: code_change.md" in err
    assert "Traceback" not in err
    assert _files(out) == {**before, "tune.jsonl": b""}


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 kB tmpfs at tmp_path/disk (root only); unmounted after the test."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
                                 capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=20)


def _fill(disk: Path, leave: int) -> Path:
    """Fill `disk` to the last byte, then free `leave` bytes of it: the filler file."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def test_a_real_full_tmpfs_leaves_the_earlier_set_and_the_rerun_writes_the_new_one(script, small_tmpfs, monkeypatch):
    from trainspeed.fileset import FileSet

    out = small_tmpfs / "out"
    _script_tune(out, {"threads": 1})
    before = _files(out)
    staged = []
    real_write = FileSet.write_text

    def counted(self, path, text, **kw):
        written = real_write(self, path, text, **kw)
        staged.append(Path(path).name)
        return written

    monkeypatch.setattr(FileSet, "write_text", counted)
    filler = _fill(small_tmpfs, leave=3 * 4096)  # room for three of the new files (a page each)
    with pytest.raises(OutputSetError) as info:
        _script_tune(out, {"threads": 2})
    assert _files(out) == before and 0 < len(staged) < len(SCRIPT_SET)  # a set cut midway, undone
    assert info.value.exit_code == 28 and "Free space on that disk" in str(info.value)
    filler.unlink()  # space freed; the same tune again
    _script_tune(out, {"threads": 2})
    after = _files(out)
    assert sorted(after) == sorted(SCRIPT_SET) and json.loads(after["tune.json"])["best_settings"] == {"threads": 2}
