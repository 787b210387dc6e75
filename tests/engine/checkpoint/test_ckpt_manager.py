from __future__ import annotations

import os
import threading
import types
import warnings

import pytest
import torch
from ckpt_helpers import tiny_model

from trainspeed.engine.checkpoint import manager as manager_mod
from trainspeed.engine.checkpoint.atomic import load_verified, manifest_path
from trainspeed.engine.checkpoint.manager import CheckpointManager, checkpoint_name
from trainspeed.engine.checkpoint.state import build_checkpoint, restore_checkpoint
from trainspeed.errors import CheckpointError, ConfigError

pytestmark = pytest.mark.timeout(60)


def _state(value: float) -> dict:
    return {"w": torch.full((4,), float(value))}


def _steps(mgr: CheckpointManager) -> list[int]:
    return [i.step for i in mgr.list_checkpoints()]


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_should_save_every_steps_and_minutes(tmp_path):
    clock = FakeClock()
    mgr = CheckpointManager(tmp_path, every_steps=5, every_minutes=2.0, clock=clock, async_save=False)
    assert [s for s in range(0, 16) if mgr.should_save(s)] == [5, 10, 15]
    clock.t += 119.0
    assert not mgr.should_save(7)
    clock.t += 1.0
    assert mgr.should_save(7)
    mgr.save(_state(7), 7)
    assert not mgr.should_save(7)  # never twice for the same step
    assert not mgr.should_save(8)  # the timer restarted at the save
    clock.t += 120.0
    assert mgr.should_save(8)
    assert not CheckpointManager(tmp_path / "x").should_save(5)  # nothing configured


@pytest.mark.parametrize("async_save", [False, True])
def test_keep_last_and_latest_pointer(tmp_path, async_save):
    events = []
    mgr = CheckpointManager(tmp_path, keep_last=2, async_save=async_save, on_event=events.append)
    for step in range(1, 6):
        mgr.save(_state(step), step)
    mgr.wait()
    assert _steps(mgr) == [4, 5]
    assert (tmp_path / "latest").read_text().strip() == checkpoint_name(5)
    assert mgr.latest() == tmp_path / checkpoint_name(5)
    assert float(mgr.load()["w"][0]) == 5.0
    assert not (tmp_path / (checkpoint_name(1) + ".json")).exists()  # manifests pruned too
    ckpt_events = [e for e in events if e["type"] == "checkpoint"]
    assert [e["ckpt_step"] for e in ckpt_events] == [1, 2, 3, 4, 5]
    assert {e["reason"] for e in ckpt_events} == {"periodic"}
    for e in ckpt_events:
        assert e["async"] is async_save and e["blocking_s"] >= 0 and e["write_s"] > 0 and e["bytes"] > 0
    assert ckpt_events[-1]["pruned"] == [checkpoint_name(3)]
    assert mgr.save(_state(5), 5).skipped  # same step again: nothing written


def test_keep_last_zero_keeps_all(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0, async_save=False)
    for step in range(1, 5):
        mgr.save(_state(step), step)
    assert _steps(mgr) == [1, 2, 3, 4]


@pytest.mark.parametrize("mode,best", [("min", [2, 4]), ("max", [1, 3])])
def test_keep_best_by_metric(tmp_path, mode, best):
    mgr = CheckpointManager(tmp_path, keep_last=1, keep_best=2, best_metric="val_loss",
                            best_mode=mode, async_save=False)
    losses = {1: 5.0, 2: 1.0, 3: 4.0, 4: 2.0, 5: 3.0, 6: float("nan")}
    for step, loss in losses.items():
        mgr.save(_state(step), step, metrics={"val_loss": torch.tensor(loss)})
    # The newest (6, NaN metric: never "best") is kept as last/latest; plus the two best.
    assert _steps(mgr) == sorted([*best, 6])
    assert [p.name for p in mgr.best_checkpoints()] == [checkpoint_name(s) for s in best]
    assert mgr.list_checkpoints()[-1].metrics == {"val_loss": None}


def test_find_resumable_skips_corrupt_newest(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0, async_save=False)
    for step in range(1, 5):
        mgr.save(_state(step), step)
    p4, p3, p2 = (tmp_path / checkpoint_name(s) for s in (4, 3, 2))
    p4.write_bytes(p4.read_bytes()[:100])  # truncated
    p3.write_bytes(os.urandom(p3.stat().st_size))  # random bytes
    manifest_path(p2).unlink()  # manifest lost
    events, skipped = [], []
    mgr2 = CheckpointManager(tmp_path, on_event=events.append)
    with pytest.warns(UserWarning, match="skipping corrupt checkpoint"):
        found = mgr2.find_resumable(on_skip=lambda p, why: skipped.append(p))
    assert found == tmp_path / checkpoint_name(1)
    assert skipped == [p4, p3, p2]
    assert "truncated" in mgr2.skipped[0] and "checksum mismatch" in mgr2.skipped[1]
    assert "missing" in mgr2.skipped[2]
    assert [e["kind"] for e in events] == ["checkpoint_corrupt"] * 3
    assert float(mgr2.load(found)["w"][0]) == 1.0
    # Corrupt files are left for inspection, not counted as "last", not deleted by retention.
    mgr2.keep_last = 1
    mgr2.save(_state(9), 9)
    mgr2.wait()
    assert p4.exists() and p3.exists() and p2.exists() and not (tmp_path / checkpoint_name(1)).exists()
    # A corrupt step that is saved again (a resumed run re-reaching it) is ordinary again.
    mgr2.save(_state(4), 4)
    mgr2.wait()
    assert p4 not in mgr2.corrupt and float(load_verified(p4)["w"][0]) == 4.0
    mgr2.save(_state(10), 10)
    mgr2.wait()
    assert not p4.exists() and p3.exists()


def test_wrong_model_checkpoint_falls_back_to_error(tmp_path):
    mgr = CheckpointManager(tmp_path, async_save=False)
    mgr.save(build_checkpoint(tiny_model(16)), 1)
    with pytest.raises(CheckpointError, match="does not fit the model"):
        restore_checkpoint(mgr.load(), tiny_model(8))


def test_resolve_resume(tmp_path):
    mgr = CheckpointManager(tmp_path / "a", async_save=False)
    assert mgr.resolve_resume(None) is None
    assert mgr.resolve_resume(None, auto_resume=True) is None
    with pytest.raises(CheckpointError, match="resume='latest'.*no intact checkpoint"):
        mgr.resolve_resume("latest")
    mgr.save(_state(1), 1)
    mgr.save(_state(2), 2)
    newest = tmp_path / "a" / checkpoint_name(2)
    assert mgr.resolve_resume(None, auto_resume=True) == newest
    assert mgr.resolve_resume("latest") == newest
    other = CheckpointManager(tmp_path / "b")
    assert other.resolve_resume(str(tmp_path / "a")) == newest
    assert other.resolve_resume(tmp_path / "a" / checkpoint_name(1)) == tmp_path / "a" / checkpoint_name(1)
    with pytest.raises(CheckpointError, match="no such file"):
        other.resolve_resume(tmp_path / "missing.pt")
    with pytest.raises(CheckpointError, match="no intact checkpoint in that directory"):
        other.resolve_resume(tmp_path / "b")
    with pytest.raises(CheckpointError, match="no intact checkpoint in"):
        other.load()


def test_async_save_returns_before_the_write(tmp_path, monkeypatch):
    release = threading.Event()
    real = manager_mod.atomic_save

    def slow_atomic_save(obj, path, **kw):
        release.wait(10)
        return real(obj, path, **kw)

    monkeypatch.setattr(manager_mod, "atomic_save", slow_atomic_save)
    mgr = CheckpointManager(tmp_path, async_save=True)
    state = _state(1.0)
    result = mgr.save(state, 1)
    # save() returned while the writer is still blocked: the caller did not pay for the write.
    assert result.async_save and result.write_s is None
    assert not (tmp_path / checkpoint_name(1)).exists()
    state["w"].fill_(99.0)  # training mutates parameters in place right after save()
    release.set()
    mgr.wait()
    assert float(load_verified(tmp_path / checkpoint_name(1))["w"][0]) == 1.0


def test_async_writer_error_surfaces_on_next_call(tmp_path):
    events = []
    mgr = CheckpointManager(tmp_path, async_save=True, on_event=events.append)
    mgr.save({"bad": lambda: 0}, 1)  # cannot be pickled: fails on the writer thread
    with pytest.raises(CheckpointError, match="background checkpoint write failed"):
        mgr.wait()
    assert events and events[0]["kind"] == "checkpoint_failed"
    mgr.save(_state(2), 2)  # the error was reported once; the manager keeps working
    mgr.close()
    assert mgr.find_resumable() == tmp_path / checkpoint_name(2)


def test_sync_error_is_checkpoint_error(tmp_path):
    mgr = CheckpointManager(tmp_path, async_save=False)
    with pytest.raises(CheckpointError, match="saving checkpoint .* failed"):
        mgr.save({"bad": lambda: 0}, 1)
    assert mgr.list_checkpoints() == []


def test_from_config_and_validation(tmp_path):
    cfg = types.SimpleNamespace(dir=None, keep_last=2, keep_best=0, best_metric="val_loss",
                                best_mode="min", every_steps=10, every_minutes=None,
                                save_final=True, async_save=False, mirror=None)
    mgr = CheckpointManager.from_config(cfg, tmp_path)
    assert mgr.directory == tmp_path / "checkpoints" and mgr.every_steps == 10
    with pytest.raises(ConfigError, match="checkpoint.dir is not set"):
        CheckpointManager.from_config(cfg, None)
    for kwargs, match in [({"keep_last": -1}, "keep_last"), ({"best_mode": "up"}, "best_mode"),
                          ({"every_steps": 0}, "every_steps"), ({"every_minutes": 0}, "every_minutes")]:
        with pytest.raises(ConfigError, match=match):
            CheckpointManager(tmp_path, **kwargs)


def test_from_real_config_class(tmp_path):
    config = pytest.importorskip("trainspeed.config")
    cfg = config.CheckpointConfig(every_steps=3, keep_last=1, async_save=False)
    mgr = CheckpointManager.from_config(cfg, tmp_path)
    for step in range(1, 7):
        if mgr.should_save(step):
            mgr.save(_state(step), step)
    assert [i.step for i in mgr.list_checkpoints()] == [6]


def test_stale_temp_removed_on_start(tmp_path):
    stale = tmp_path / ".step-00000003.pt.tmp-999999999-0badf00d"
    stale.write_bytes(b"half a checkpoint")
    events = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CheckpointManager(tmp_path, on_event=events.append).poll()
    assert not stale.exists() and events[0]["kind"] == "checkpoint_temp_removed"
