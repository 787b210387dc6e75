"""A full disk during a save, for every checkpoint kind (torch.save, async, DCP, DeepSpeed):
one line naming it ("no space left on PATH: N MB needed, M free"), no temp files left holding
the space, the previous checkpoint still the one a resume takes. ENOSPC is injected
(disk_full.py): no root, no tmpfs."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from ckpt_helpers import tiny_model
from disk_full import full_disk

from trainspeed.engine.checkpoint.manager import CheckpointManager, find_resumable
from trainspeed.engine.checkpoint.sharded import ShardedIO, ShardedState
from trainspeed.engine.checkpoint.space import low_space_note, says_no_space
from trainspeed.engine.checkpoint.state import TrainState, build_checkpoint
from trainspeed.errors import CheckpointError, DiskFullError, TrainspeedWarning

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

ONE_LINE = re.compile(r"^no space left on \S+: [\d.]+ MB needed, [\d.]+ MB free \(the (\w+ )?checkpoint was not written")


def _state(step: int, width: int = 256):
    torch.manual_seed(step)
    model = torch.nn.Linear(width, width)
    return build_checkpoint(model, None, counters=TrainState(step=step))


def _leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("async_save", [False, True])
def test_a_full_disk_is_named_in_one_line_and_the_last_good_checkpoint_stays(tmp_path, async_save):
    mgr = CheckpointManager(tmp_path, async_save=async_save, keep_last=1)
    mgr.save(_state(1), 1)
    mgr.wait()
    with full_disk(tmp_path, budget=20_000) as disk, pytest.raises(DiskFullError) as info:
        mgr.save(_state(2), 2)
        mgr.wait()
    assert disk.failures >= 1
    message = str(info.value)
    assert ONE_LINE.match(message) and "\n" not in message, message
    assert "sharded" not in message and "unexpected pos" not in message
    assert info.value.needed >= 256 * 256 * 4  # the weights it had to write
    assert _leftovers(tmp_path) == []  # the temp file is gone: its space is free again
    assert find_resumable(tmp_path) == tmp_path / "step-00000001.pt"
    assert mgr.latest() == tmp_path / "step-00000001.pt"
    mgr.close()


def test_a_manifest_that_does_not_fit_takes_its_payload_back(tmp_path):
    """The payload fit the disk's last bytes, its manifest did not: the payload stayed under its
    final name without a manifest (no checkpoint --auto-resume takes), holding the space."""
    mgr = CheckpointManager(tmp_path, async_save=False, keep_last=2)
    mgr.save(_state(1), 1)
    payload = (tmp_path / "step-00000001.pt").stat().st_size
    with full_disk(tmp_path, budget=payload) as disk, pytest.raises(DiskFullError) as info:
        mgr.save(_state(2), 2)
    assert disk.failures == 1 and info.value.needed >= payload  # the checkpoint's size, not the manifest's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000001.pt", "step-00000001.pt.json"]
    assert find_resumable(tmp_path) == tmp_path / "step-00000001.pt"
    mgr.close()


def test_the_old_code_path_said_nothing_of_space(tmp_path):
    """What torch.save itself reports through a file that hits ENOSPC: the zip writer's
    'unexpected pos', which is why the atomic writer records the file's own error."""
    with full_disk(tmp_path, budget=1000), pytest.raises(DiskFullError):
        from trainspeed.engine.checkpoint.atomic import atomic_save

        atomic_save(_state(1), tmp_path / "x.pt")
    assert _leftovers(tmp_path) == []


def _sharded_manager(tmp_path, async_save):
    torch.manual_seed(0)
    model = torch.nn.Linear(128, 128)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    mgr = CheckpointManager(tmp_path, async_save=async_save)
    mgr.sharded = ShardedIO(model, opt)
    return mgr


def _save_sharded(mgr, step):
    rest = build_checkpoint(None, None, counters=TrainState(step=step))
    return mgr.save_sharded(ShardedState(tensors=mgr.sharded.state_dicts(), rest=rest), step)


@pytest.mark.parametrize("async_save", [False, True])
def test_a_dcp_save_on_a_full_disk_removes_its_temp_directory(tmp_path, async_save):
    mgr = _sharded_manager(tmp_path, async_save)
    _save_sharded(mgr, 1)
    mgr.wait()
    with full_disk(tmp_path, budget=5_000), pytest.raises(DiskFullError) as info:
        _save_sharded(mgr, 2)
        mgr.wait()
    message = str(info.value)
    # one process: a DCP directory, but no "sharded checkpoint" for a run that is not sharded
    assert ONE_LINE.match(message) and "sharded" not in message, message
    assert _leftovers(tmp_path) == []
    assert find_resumable(tmp_path) == tmp_path / "step-00000001.dcp"
    mgr.close()


class _FakeDeepSpeed:
    """save_checkpoint as DeepSpeed does it on a full disk: part of a file, then its error."""

    def __init__(self):
        self.module = torch.nn.Linear(64, 64)
        self.full = False

    def save_checkpoint(self, directory, tag, client_state, save_latest):
        from pathlib import Path

        out = Path(directory) / tag
        out.mkdir(parents=True, exist_ok=True)
        (out / "mp_rank_00_model_states.pt").write_bytes(b"x" * (10 if self.full else 1000))
        if self.full:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1232192 vs 1232080") \
                from OSError(28, "No space left on device")


def test_a_deepspeed_save_on_a_full_disk_is_named_and_cleaned(tmp_path):
    from trainspeed.engine.checkpoint.deepspeed_io import DeepSpeedIO

    engine = _FakeDeepSpeed()
    mgr = CheckpointManager(tmp_path, async_save=True)
    mgr.sharded = DeepSpeedIO(engine, world_size=1)
    _save_sharded(mgr, 1)
    engine.full = True
    with pytest.raises(DiskFullError) as info:
        _save_sharded(mgr, 2)
    message = str(info.value)
    assert message.startswith(f"no space left on {tmp_path}: ") and "the DeepSpeed checkpoint" in message
    assert "sharded" not in message
    assert _leftovers(tmp_path) == []  # the .step-N.ds.tmp-* directory no longer holds the space
    assert find_resumable(tmp_path) == tmp_path / "step-00000001.ds"
    mgr.close()


def test_a_save_warns_once_before_the_disk_is_too_small(tmp_path, monkeypatch):
    from trainspeed.engine.checkpoint import space

    events = []
    mgr = CheckpointManager(tmp_path, async_save=False, on_event=events.append)
    monkeypatch.setattr(space.shutil, "disk_usage", lambda p: type("U", (), {"free": 100_000})())
    with pytest.warns(TrainspeedWarning, match="MB free on") as seen:
        mgr.save(_state(1), 1)
        mgr.save(_state(2), 2)
    assert len(seen) == 1  # once, not at every save
    low = [e for e in events if e.get("kind") == "low_disk_space"]
    assert len(low) == 1 and "0.1 MB free" in low[0]["message"]
    assert low_space_note(tmp_path, 10) is None


def test_no_space_is_recognised_through_wrappers():
    inner = OSError(28, "No space left on device")
    outer = RuntimeError("unexpected pos 5 vs 3")
    outer.__cause__ = inner
    assert says_no_space(outer)
    dcp = BaseException("checkpoint failed")
    dcp.failures = {0: (inner, "tb")}
    assert says_no_space(dcp)
    assert not says_no_space(RuntimeError("shape mismatch"))
    assert issubclass(DiskFullError, CheckpointError)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert DiskFullError("/x", 2_000_000, 1_000_000).exit_code == 28
