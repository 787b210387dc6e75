"""Sharded (DCP directory) checkpoints in one process: the manager's layout, atomicity,
retention and resume rules for directories beside single-file checkpoints. (The 2-rank
behaviour is in tests/distributed/.)"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from ckpt_helpers import tiny_model

from trainspeed.engine.checkpoint.manager import CheckpointManager, find_resumable, list_checkpoints
from trainspeed.engine.checkpoint.sharded import ShardedIO, ShardedState, verify_dir
from trainspeed.engine.checkpoint.state import TrainState, build_checkpoint, restore_checkpoint
from trainspeed.errors import CheckpointError

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def _trained(seed: int = 0):
    torch.manual_seed(seed)
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def _manager(tmp_path, model, opt, **kw) -> CheckpointManager:
    mgr = CheckpointManager(tmp_path, **kw)
    mgr.sharded = ShardedIO(model, opt)
    return mgr


def _save(mgr: CheckpointManager, step: int, model, opt, **kw):
    rest = build_checkpoint(None, None, counters=TrainState(step=step, samples=10 * step))
    return mgr.save_sharded(ShardedState(tensors=mgr.sharded.state_dicts(), rest=rest), step, **kw)


@pytest.mark.parametrize("async_save", [False, True])
def test_sharded_save_is_a_directory_that_resumes_exactly(tmp_path, async_save):
    model, opt = _trained()
    mgr = _manager(tmp_path, model, opt, async_save=async_save)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    result = _save(mgr, 4, model, opt, metrics={"val_loss": 0.5}, reason="final")
    with torch.no_grad():  # training goes on while an async save writes: it must not leak in
        for p in model.parameters():
            p.add_(1.0)
    mgr.wait()
    assert result.path.name == "step-00000004.dcp" and result.async_save is async_save
    marker = verify_dir(result.path)
    assert marker["reason"] == "final" and marker["metrics"] == {"val_loss": 0.5}
    assert {".metadata", "__0_0.distcp", "trainer_state.pt"} <= set(marker["files"])
    assert mgr.latest() == result.path and find_resumable(tmp_path) == result.path
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # temp dir renamed
    fresh, fresh_opt = _trained(seed=1)
    rest = ShardedIO(fresh, fresh_opt).load(result.path)
    counters = restore_checkpoint(rest, None, None)
    assert counters.step == 4 and counters.samples == 40
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, want[k]), k
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    events = []
    mgr.on_event = events.append
    mgr.close()
    assert [e["type"] for e in events] in ([], ["checkpoint"])  # delivered at save or wait time


def test_directories_and_files_share_keep_last_and_newest_intact(tmp_path):
    model, opt = _trained()
    mgr = _manager(tmp_path, model, opt, async_save=False, keep_last=2)
    mgr.save({"w": torch.ones(2)}, 1)
    _save(mgr, 2, model, opt)
    mgr.save({"w": torch.ones(2)}, 3)
    _save(mgr, 4, model, opt)
    infos = list_checkpoints(tmp_path)
    assert [(i.step, i.path.name) for i in infos] == [(3, "step-00000003.pt"), (4, "step-00000004.dcp")]
    assert infos[1].manifest["world_size"] == 1  # the marker serves as the directory's manifest
    assert not (tmp_path / "step-00000002.dcp").exists()  # pruned as a whole


def test_half_written_and_damaged_directories_are_never_resumed(tmp_path):
    model, opt = _trained()
    mgr = _manager(tmp_path, model, opt, async_save=False, keep_last=0)
    mgr.save({"w": torch.ones(2)}, 1)
    good = _save(mgr, 2, model, opt).path
    # a save killed before rank 0's marker: under a temp name, invisible to listing
    tmp = tmp_path / ".step-00000005.dcp.tmp-999999-abcd"
    tmp.mkdir()
    (tmp / "__0_0.distcp").write_bytes(b"x")
    # a final-named directory whose shard was cut short, and one without its marker
    cut = _save(mgr, 3, model, opt).path
    shard = cut / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:10])
    bare = _save(mgr, 4, model, opt).path
    (bare / "trainspeed.json").unlink()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert mgr.find_resumable() == good
    assert any("cut short" in s for s in mgr.skipped) and any("no trainspeed.json" in s for s in mgr.skipped)
    with pytest.raises(CheckpointError, match="has 10 bytes, the marker says"):
        mgr.resolve_resume(str(cut))
    assert mgr.resolve_resume(str(good)) == good  # a directory checkpoint named directly
    # the stale temp directory (its pid is gone) is removed by the next writer's manager
    CheckpointManager(tmp_path, async_save=False)
    assert not tmp.exists() and good.exists()


def test_non_writer_ranks_leave_temp_files_and_pointers_alone(tmp_path):
    tmp = tmp_path / ".step-00000005.dcp.tmp-999999-abcd"
    tmp.mkdir()
    CheckpointManager(tmp_path, async_save=False, writer=False)
    assert tmp.exists()  # may be rank 0's, on another node: not this rank's to judge


def test_single_file_load_of_a_directory_says_how(tmp_path):
    model, opt = _trained()
    mgr = _manager(tmp_path, model, opt, async_save=False)
    path = _save(mgr, 2, model, opt).path
    with pytest.raises(CheckpointError, match="sharded \\(DCP\\) checkpoint.*dcp_to_torch_save"):
        mgr.load(path)


def test_a_model_that_does_not_fit_names_both_world_sizes(tmp_path):
    model, opt = _trained()
    mgr = _manager(tmp_path, model, opt, async_save=False)
    path = _save(mgr, 2, model, opt).path
    other = torch.nn.Sequential(torch.nn.Linear(4, 3))
    with pytest.raises(CheckpointError, match="saved by 1 rank\\(s\\) into this run of 1 rank.*Size mismatch"):
        ShardedIO(other, torch.optim.AdamW(other.parameters())).load(path)
    assert os.path.isdir(path)
