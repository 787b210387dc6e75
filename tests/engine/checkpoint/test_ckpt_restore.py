"""Restoring from checkpoint.mirror: `--resume URL` of one checkpoint, and --auto-resume with
the local directory gone or damaged taking the newest intact (manifest-verified) copy from the
mirror. Against memory:// and an S3-compatible server (moto's) the test starts on localhost;
the S3 test is skipped when moto[server] or s3fs is missing."""

from __future__ import annotations

import shutil
import socket

import pytest
import torch

from trainspeed.engine.checkpoint.atomic import load_verified
from trainspeed.engine.checkpoint.manager import CheckpointManager, checkpoint_name
from trainspeed.errors import CheckpointError

pytestmark = pytest.mark.timeout(90)


def _saved(directory, url, steps=(3, 6)):
    mgr = CheckpointManager(directory, async_save=False, keep_last=0, mirror=url)
    for step in steps:
        mgr.save({"w": torch.full((4,), float(step))}, step)
    mgr.close()


def _check_restore(tmp_path, url, fs, root, capsys):
    local = tmp_path / "run" / "checkpoints"
    _saved(local, url)
    shutil.rmtree(local)  # the local disk is gone
    mgr = CheckpointManager(local, async_save=False, mirror=url)
    found = mgr.resolve_resume(None, auto_resume=True)
    assert found == local / checkpoint_name(6)
    assert float(load_verified(found)["w"][0]) == 6.0
    assert f"restored {checkpoint_name(6)} from the mirror {url}" in capsys.readouterr().err
    mgr.close()

    # the newest copy on the mirror is damaged and the local directory too: the older one
    shutil.rmtree(local)
    fs.pipe_file(f"{root}/{checkpoint_name(6)}", b"garbage")
    mgr = CheckpointManager(local, async_save=False, mirror=url)
    assert mgr.resolve_resume(None, auto_resume=True) == local / checkpoint_name(3)
    assert any("checksum" in s or "truncated" in s for s in mgr.skipped)
    mgr.close()

    # --resume URL names one checkpoint
    shutil.rmtree(local)
    mgr = CheckpointManager(local, async_save=False)
    path = mgr.resolve_resume(f"{url}/{checkpoint_name(3)}")
    assert float(mgr.load(path)["w"][0]) == 3.0
    with pytest.raises(CheckpointError, match="no intact checkpoint there"):
        mgr.resolve_resume(f"{url}/{checkpoint_name(6)}")
    mgr.close()


def test_restore_from_a_memory_mirror(tmp_path, capsys):
    fsspec = pytest.importorskip("fsspec")
    _check_restore(tmp_path, "memory://restore-test/run1", fsspec.filesystem("memory"),
                   "/restore-test/run1", capsys)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_server(monkeypatch):
    server_mod = pytest.importorskip("moto.server", reason="needs moto[server]")
    s3fs = pytest.importorskip("s3fs", reason="needs s3fs")
    import fsspec

    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint, "skip_instance_cache": True})
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
    fs.mkdir("ckpts")
    try:
        yield fs
    finally:
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()


def test_restore_from_an_s3_server_on_localhost(tmp_path, capsys, s3_server):
    _check_restore(tmp_path, "s3://ckpts/run1", s3_server, "ckpts/run1", capsys)


def test_auto_resume_with_nothing_anywhere_starts_fresh(tmp_path):
    pytest.importorskip("fsspec")
    mgr = CheckpointManager(tmp_path / "c", async_save=False, mirror="memory://restore-empty/x")
    assert mgr.resolve_resume(None, auto_resume=True) is None
    mgr.close()
