"""A checkpoint copied without its manifest (`step-N.pt` alone, or a directory of them without
the `.json` files) resumes when named: the file is verified by the CRC-32s its own zip records.
A copy that is cut short or changed, or one that records no CRC-32s, is refused with the file
to copy named."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainspeed.engine.checkpoint.atomic import atomic_save, manifest_path
from trainspeed.engine.checkpoint.without_manifest import verify_contents, verify_named
from trainspeed.engine.trainer import Trainer
from trainspeed.errors import CheckpointError
from trainspeed.telemetry import read_run

pytestmark = pytest.mark.timeout(120)


def _data():
    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x.sum(1, keepdim=True))


def mse(model, batch):
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def _model():
    torch.manual_seed(0)
    return nn.Linear(4, 1)


def _cfg(out_dir, name, max_steps, **checkpoint):
    return {"run": {"out_dir": str(out_dir), "name": name, "max_steps": max_steps, "seed": 3},
            "data": {"batch_size": 8, "shuffle": True}, "logging": {"every": 2, "warmup_steps": 0, "progress": False},
            "eval": {"at_end": False}, "checkpoint": {"async_save": False, **checkpoint}}


@pytest.mark.parametrize("copy", ["file", "directory"])
def test_a_checkpoint_copied_without_its_manifest_resumes_where_it_stopped(tmp_path, copy, capsys):
    straight = _model()
    Trainer(straight, mse, _data(), config=_cfg(tmp_path, "straight", 8)).fit()
    Trainer(_model(), mse, _data(), config=_cfg(tmp_path, "part", 4)).fit()
    elsewhere = tmp_path / "other-machine"
    elsewhere.mkdir()
    saved = tmp_path / "part" / "checkpoints" / "step-00000004.pt"
    shutil.copy(saved, elsewhere / saved.name)  # the payload alone, no step-00000004.pt.json
    resumed = nn.Linear(4, 1)  # fresh weights: all of them must come from the copy
    resume = elsewhere / saved.name if copy == "file" else elsewhere
    Trainer(resumed, mse, _data(), config=_cfg(tmp_path, "resumed", 8, resume=str(resume))).fit()
    assert "verified by the zip CRC-32s the file records" in capsys.readouterr().err
    for p, q in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
    run = read_run(tmp_path / "resumed")
    assert [r["step"] for r in run.steps][0] == 5
    restart = next(e["data"] for e in run.events_of("restart") if "from_step" in e["data"])
    assert restart["from_step"] == 4 and restart["verified_by"] == "zip CRC-32"


def _payload(path):
    atomic_save({"w": torch.arange(4096.0), "b": torch.ones(3)}, path)
    manifest_path(path).unlink()
    return path


def test_a_damaged_copy_without_its_manifest_says_which_file_to_copy_again(tmp_path):
    good = _payload(tmp_path / "step-00000001.pt")
    assert verify_contents(good)["verified_by"] == "zip CRC-32"
    assert verify_named(good)["bytes"] == good.stat().st_size
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match=r"cut\.pt: the file \(5000 bytes\) is cut short.*manifest cut\.pt\.json "
                                              r"is missing\. Copy cut\.pt again"):
        verify_named(cut)
    changed = tmp_path / "changed.pt"
    data = bytearray(good.read_bytes())
    start = data.index(torch.arange(4096.0).numpy().tobytes()[:64])
    data[start + 100] ^= 0xFF  # one byte of w's storage
    changed.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"changed\.pt: .*is damaged \(Bad CRC-32 .*Copy changed\.pt again"):
        verify_named(changed)


def test_a_file_without_crc32s_and_without_its_manifest_names_the_manifest_to_copy(tmp_path):
    from torch import serialization

    if not hasattr(serialization, "set_crc32_options"):
        pytest.skip("this torch always records CRC-32s")
    serialization.set_crc32_options(False)
    try:
        path = _payload(tmp_path / "step-00000002.pt")
    finally:
        serialization.set_crc32_options(True)
    with pytest.raises(CheckpointError, match=r"manifest step-00000002\.pt\.json is missing and the file records no "
                                              r"CRC-32s .*Copy step-00000002\.pt\.json from the directory it was saved in"):
        verify_named(path)
