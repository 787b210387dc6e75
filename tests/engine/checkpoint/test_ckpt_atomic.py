from __future__ import annotations

import json
import os

import pytest
import torch

from trainspeed.engine.checkpoint.atomic import (
    atomic_save,
    cleanup_stale_temps,
    is_temp_name,
    load_verified,
    manifest_path,
    verify,
)
from trainspeed.errors import CheckpointError

pytestmark = pytest.mark.timeout(60)


def _payload() -> dict:
    torch.manual_seed(1)
    return {"w": torch.randn(16, 8), "step": 7, "names": ["a", "b"], "nested": {"x": torch.arange(5)}}


def test_roundtrip_and_manifest(tmp_path):
    path = tmp_path / "step-00000007.pt"
    manifest = atomic_save(_payload(), path, meta={"step": 7})
    assert path.is_file() and manifest_path(path).is_file()
    on_disk = json.loads(manifest_path(path).read_text())
    assert on_disk == manifest
    assert on_disk["bytes"] == path.stat().st_size
    assert on_disk["step"] == 7 and len(on_disk["sha256"]) == 64
    loaded = load_verified(path)
    assert torch.equal(loaded["w"], _payload()["w"])
    assert loaded["names"] == ["a", "b"] and loaded["step"] == 7
    assert torch.equal(loaded["nested"]["x"], torch.arange(5))
    # Nothing but the payload and its manifest is left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000007.pt", "step-00000007.pt.json"]


def test_truncated_file_is_named_and_explained(tmp_path):
    path = tmp_path / "ckpt.pt"
    atomic_save(_payload(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"ckpt\.pt.*truncated.*manifest says"):
        load_verified(path)


def test_random_bytes_same_length_fail_checksum(tmp_path):
    path = tmp_path / "ckpt.pt"
    atomic_save(_payload(), path)
    path.write_bytes(os.urandom(path.stat().st_size))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        verify(path)


def test_single_flipped_byte_is_detected(tmp_path):
    path = tmp_path / "ckpt.pt"
    atomic_save(_payload(), path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_verified(path)


def test_missing_and_bad_manifest(tmp_path):
    path = tmp_path / "ckpt.pt"
    atomic_save(_payload(), path)
    manifest_path(path).write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        verify(path)
    manifest_path(path).unlink()
    with pytest.raises(CheckpointError, match="manifest ckpt.pt.json is missing"):
        load_verified(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_verified(tmp_path / "nope.pt")


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_weights_only_refuses_code(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    atomic_save({"x": _Evil()}, path)  # a valid manifest: only weights_only stands in the way
    with pytest.raises(CheckpointError, match="refused to load.*WeightsUnpickler"):
        load_verified(path)
    assert "this must never run" not in capsys.readouterr().out


def test_failed_save_leaves_old_file_and_no_temp(tmp_path):
    path = tmp_path / "ckpt.pt"
    atomic_save({"v": torch.ones(3)}, path)
    before = path.read_bytes(), manifest_path(path).read_bytes()
    with pytest.raises(Exception):
        atomic_save({"v": torch.zeros(3), "bad": lambda: 0}, path)  # lambdas cannot be pickled
    assert (path.read_bytes(), manifest_path(path).read_bytes()) == before
    assert torch.equal(load_verified(path)["v"], torch.ones(3))
    assert not [p for p in tmp_path.iterdir() if is_temp_name(p.name)]


def test_cleanup_stale_temps_keeps_live_writers(tmp_path):
    dead = tmp_path / ".step-00000001.pt.tmp-999999999-abcd1234"  # no such pid
    mine = tmp_path / f".step-00000002.pt.tmp-{os.getpid()}-abcd1234"
    other = tmp_path / "notes.txt"
    for p in (dead, mine, other):
        p.write_bytes(b"x")
    assert cleanup_stale_temps(tmp_path) == [dead]
    assert not dead.exists() and mine.exists() and other.exists()


def test_a_damaged_checkpoint_names_the_earlier_one_to_resume_and_a_missing_manifest_says_what_it_costs(tmp_path):
    """`--resume` of a truncated file said "use an earlier checkpoint" and named none; one copied
    without its manifest was told to torch.load it, which does not resume a run: resuming it by
    name does (without_manifest.py)."""
    older, newest = tmp_path / "step-00000040.pt", tmp_path / "step-00000060.pt"
    atomic_save(_payload(), older)
    atomic_save(_payload(), newest)
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=rf"truncated.*use an earlier checkpoint \(--resume {older}\)\."):
        verify(newest)
    manifest_path(newest).unlink()
    with pytest.raises(CheckpointError, match=rf"Copy step-00000060\.pt\.json beside it, or resume from the file "
                                              rf"by name \(--resume {newest}: .*\), or from an earlier "
                                              rf"checkpoint \(--resume {older}\)\."):
        verify(newest)
    manifest_path(older).unlink()  # nothing earlier with its manifest: no name
    with pytest.raises(CheckpointError, match=r"the file records verify it\)\.$"):
        verify(newest)
