"""A tune whose --out fills up, or whose terminal closes: the trials measured are kept, a trial
the full disk failed is never kept as the setting's result, and the tune says how to resume.
ENOSPC is simulated (no root, no tmpfs): by the trial's error text, or a statvfs of no space."""

from __future__ import annotations

import errno
import os
import signal
from types import SimpleNamespace

import pytest

from trainspeed.tune import store as store_mod
from trainspeed.tune.search import Tuner, TuneOptions
from trainspeed.tune.store import TrialStore
from trainspeed.tune.trials import TrialResult

from tune_fakes import FakeRunner

pytestmark = pytest.mark.timeout(60)
BF16 = "precision.mode=bf16-mixed"


def _failed(label="best", error="exit code 120, nothing on stderr"):
    return TrialResult(ok=False, key="k", label=label, repeat=0, wall_s=1.0, error=error)


def _statvfs(free):  # as shutil.disk_usage reads it (engine/checkpoint/space.free_bytes)
    return lambda path: SimpleNamespace(f_bavail=free // 4096, f_bfree=free // 4096, f_blocks=(20 << 30) // 4096,
                                        f_frsize=4096)


def test_a_trial_failed_by_the_full_disk_is_not_stored_and_stops_the_tune(tmp_path, monkeypatch):
    """Seen on a 300 kB tmpfs: the verification trial exited 120 (its output could not be
    flushed), was stored, and the tune resumed after space was freed reused that failure: the
    8.9x faster setting read 'failed' and best.yaml kept the baseline."""
    monkeypatch.setattr(os, "statvfs", _statvfs(0))
    store = TrialStore(tmp_path)
    with pytest.raises(OSError) as info:
        store.add(_failed())
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path)
    assert "trial best failed: exit code 120" in info.value.strerror
    assert store.get("k", 0) is None and len(TrialStore(tmp_path)) == 0


def test_a_failure_with_space_left_is_kept_as_the_settings_result(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "statvfs", _statvfs(10 << 30))
    store = TrialStore(tmp_path)
    store.add(_failed(error="OOM (exit 1): CUDA out of memory"))
    assert not TrialStore(tmp_path).get("k", 0).ok  # reused: the setting's own failure


def test_a_stored_no_space_failure_of_an_earlier_tune_runs_again(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "statvfs", _statvfs(10 << 30))
    monkeypatch.setattr(store_mod, "failed_for_space", lambda r, d: False)  # an earlier version stored it
    TrialStore(tmp_path).add(_failed(label="baseline", error="exit code 28: trainspeed: error: cannot "
                                                           "write: No space left on device"))
    assert TrialStore(tmp_path).get("k", 0) is None


def test_a_tune_on_a_full_disk_resumes_with_the_trials_it_measured(base_config, cpu, tmp_path, monkeypatch):
    """The disk fills while a trial runs: the tune stops (OSError ENOSPC); once space is freed
    the same --out reuses every trial measured before, and runs the failed one again."""
    runner = FakeRunner({BF16: 0.5})
    real = runner.__call__
    calls = {"n": 0, "at": None}

    def filling(req):
        calls["n"] += 1
        if req.label == "best" and calls["at"] is None:  # the verification of bf16, as seen
            calls["at"] = calls["n"]
            monkeypatch.setattr(os, "statvfs", _statvfs(0))
            return TrialResult(ok=False, key=req.key, label=req.label, repeat=req.repeat, wall_s=1.0,
                               error="exit code 120, nothing on stderr")
        return real(req)

    monkeypatch.setattr(os, "statvfs", _statvfs(10 << 30))
    options = TuneOptions(budget_s=10_000, knobs=["precision"])
    with pytest.raises(OSError):
        Tuner(base_config=base_config, base_hash="h", device=cpu, runner=filling, store=TrialStore(tmp_path),
              options=options, say=lambda s: None).run()
    measured = calls["at"] - 1
    stored = TrialStore(tmp_path)._results
    assert measured > 2 and len(stored) == measured
    monkeypatch.setattr(os, "statvfs", _statvfs(10 << 30))  # space freed
    again = FakeRunner({BF16: 0.5})
    result = Tuner(base_config=base_config, base_hash="h", device=cpu, runner=again, store=TrialStore(tmp_path),
                   options=options, say=lambda s: None).run()
    ran_again = {(r.key, r.repeat) for r in again.calls}
    assert result.trials_reused >= measured - 1 and not ran_again & set(stored)  # none measured twice
    assert "best" in {r.label for r in again.calls}  # the failed one runs again
    assert all(r.ok for r in TrialStore(tmp_path)._results.values())
    assert result.best_settings == {"precision.mode": "bf16-mixed"}


def _tune_cli(tmp_path, monkeypatch, capsys, session_fn):
    import trainspeed.tune.script_session as script_session
    from trainspeed.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.setattr(script_session, "run_script_tune", session_fn)
    code = main(["tune", "--knobs", "threads", "--budget", "2m", "--", "python", "train.py"])
    return code, capsys.readouterr().err


def test_a_full_out_disk_says_what_is_full_and_the_command_that_resumes(tmp_path, monkeypatch, capsys):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "runs/tune-train-threads"))

    code, err = _tune_cli(tmp_path, monkeypatch, capsys, full)
    assert code == 28, err
    assert "no space left on" in err and "runs/tune-train-threads" in err
    assert "no trial had finished" in err  # not 'the finished trials are kept in' a file never written
    assert "Resume with:\n    trainspeed tune --out runs/tune-train-threads --knobs threads" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR1])
def test_a_tune_ended_by_sighup_or_slurms_sigusr1_says_how_to_resume(tmp_path, monkeypatch, capsys, sig):
    """The terminal or SSH session closed (SIGHUP), or SLURM's warning before a time limit
    (SIGUSR1, sbatch --signal=USR1@90): either ended the tune without a word."""
    name = signal.Signals(sig).name

    def stopped(*a, **k):
        if signal.getsignal(sig) is signal.SIG_DFL:  # it would end pytest itself
            raise AssertionError(f"no {name} handler while the tune runs")
        os.kill(os.getpid(), sig)  # delivered at the next bytecode of this thread
        raise AssertionError(f"{name} was not turned into an interrupt")

    before = signal.getsignal(sig)
    code, err = _tune_cli(tmp_path, monkeypatch, capsys, stopped)
    assert code == 128 + sig and "Resume with:\n    trainspeed tune --out runs/tune-train-threads" in err, err
    assert signal.getsignal(sig) is before
