"""End to end with 2 CPU processes (gloo), launched as users do:
`python -m torch.distributed.run --nproc_per_node 2 -m trainspeed train gpt ...`.

The reference is one process with the doubled batch: 2 ranks x batch 4 train on the same 8
samples per step (rank r takes every 2nd index of the shared order), so without dropout the
loss curves agree to float rounding (the gradients are averaged in a different order).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_helpers import TINY, assert_close, cmd, env, free_port, losses, train

# The two-rank DDP run and its tests stay in `make test` (one multi-rank launch, ~15 s); the
# rest of the module (FSDP, resumes, kills) is `slow`: `make test-all` and CI run it.
pytestmark = [pytest.mark.timeout(150)]

@pytest.fixture(scope="module")
def ws(shared_dir, built_once):
    """Working directory with a pre-built token cache (so the ranks do not both build it),
    shared by the session's workers, as are the runs below (built_once, tests/conftest.py)."""
    from trainspeed.recipes.gpt import data as gdata

    def build() -> Path:
        root = shared_dir / "torchrun"
        root.mkdir(exist_ok=True)
        gdata.load_tokens(directory=root / "cache")
        return root

    return built_once("torchrun-ws", build)


@pytest.fixture(scope="module")
def single(ws, built_once):
    return built_once("torchrun-single", lambda: train(ws, "single", "data.batch_size=8", nproc=1))


@pytest.fixture(scope="module")
def ddp(ws, built_once):
    return built_once("torchrun-ddp", lambda: train(ws, "ddp", "distributed.strategy=ddp", "data.batch_size=4",
                                                    report=True))


@pytest.fixture(scope="module")
def fsdp(ws, built_once):
    return built_once("torchrun-fsdp", lambda: train(ws, "fsdp", "distributed.strategy=fsdp", "data.batch_size=4"))


def test_ddp_two_ranks_match_one_process_with_double_batch(single, ddp):
    ref = losses(single)
    assert len(ref) == 6 and len(set(ref.values())) > 1  # a real curve, not a constant
    assert_close(losses(ddp), ref)
    # every rank logs the loss averaged over ranks (all-reduced at the log interval)
    assert losses(ddp, rank=1) == losses(ddp)


@pytest.mark.slow
def test_fsdp_two_ranks_match_one_process_with_double_batch(single, fsdp):
    # fast.yaml clips gradients at 1.0: clipping on sharded gradients must see the global norm
    assert_close(losses(fsdp), losses(single))


@pytest.mark.slow
def test_ddp_with_accumulation_matches_too(ws, single):
    """2 ranks x 2 micro-batches of 2 = the same 8 samples per step; all-reduce only on the
    last micro-batch (no_sync on the others) still averages the full gradient."""
    run = train(ws, "ddp-accum", "distributed.strategy=ddp", "data.batch_size=2", "accumulation.steps=2",
                "checkpoint.every_steps=null")
    assert_close(losses(run), losses(single))


def test_ddp_run_dir_has_per_rank_files_and_report_table(ddp):
    rank1 = ddp / "ranks" / "rank1"
    assert (rank1 / "steps.jsonl").exists() and not (rank1 / "config.yaml").exists()
    recs = [json.loads(line) for line in (rank1 / "steps.jsonl").read_text().splitlines()]
    assert {r["rank"] for r in recs} == {1} and len(recs) == 6
    report = json.loads((ddp / "report.json").read_text())
    rows = report["summary"]["ranks"]
    assert [r["rank"] for r in rows] == [0, 1] and all(r["steps"] == 6 for r in rows)
    assert all(r["data_wait_p50"] is not None and r["step_time_p50"] > 0 for r in rows)
    out = (ddp / "stdout.txt").read_text()
    assert "Per rank (data parallel)" in out and "data parallel  2 ranks" in out
    assert "Per rank (data parallel)" in (ddp / "report.html").read_text()
    # checkpoints: written by rank 0 only, one file per save
    assert sorted(p.name for p in (ddp / "checkpoints").glob("*.pt")) == ["step-00000003.pt", "step-00000006.pt"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_resume_continues_the_same_curve(ws, single, ddp, fsdp, strategy):
    source = {"ddp": ddp / "checkpoints" / "step-00000003.pt",
              "fsdp": fsdp / "checkpoints" / "step-00000003.dcp"}[strategy]
    resumed = train(ws, f"{strategy}-resumed", f"distributed.strategy={strategy}", "data.batch_size=4",
                    "--resume", str(source))
    assert_close(losses(resumed), {s: v for s, v in losses(single).items() if s > 3})


@pytest.mark.slow
def test_fsdp_checkpoint_is_one_sharded_directory_per_save(fsdp):
    from trainspeed.engine.checkpoint import find_resumable, list_checkpoints
    from trainspeed.engine.checkpoint.sharded import verify_dir

    ckpts = fsdp / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-00000003.dcp", "step-00000006.dcp"]
    d = ckpts / "step-00000006.dcp"
    names = {p.name for p in d.iterdir()}
    # each rank wrote its own shards; rank 0 the DCP index, the non-tensor state and the marker
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "trainer_state.pt", "trainspeed.json"} <= names
    marker = verify_dir(d)
    assert marker["world_size"] == 2 and marker["step"] == 6 and marker["reason"] == "periodic"
    assert [i.step for i in list_checkpoints(ckpts)] == [3, 6] and find_resumable(ckpts) == d
    assert (ckpts / "latest").read_text().strip() == "step-00000006.dcp"
    events = [json.loads(x) for x in (fsdp / "events.jsonl").read_text().splitlines()]
    saves = [e["data"] for e in events if e["type"] == "checkpoint"]
    assert [(s["ckpt_step"], s["sharded"], s["async"]) for s in saves] == [(3, True, True), (6, True, True)]
    ops = next(e["data"]["ops"] for e in events if e["type"] == "collectives")
    assert ops["loss all-reduce"]["calls"] == 6 and ops["loss all-reduce"]["seconds"] > 0


@pytest.mark.slow
def test_fsdp_checkpoint_resumes_on_one_process(ws, single, fsdp):
    """Another world size (2 -> 1): DCP reshards the saved shards into the unsharded model and
    optimizer, and the sampler maps 2 ranks x 12 samples to 24 samples of one process."""
    resumed = train(ws, "fsdp-to-one", "data.batch_size=8", "--resume",
                    str(fsdp / "checkpoints" / "step-00000003.dcp"), nproc=1)
    assert_close(losses(resumed), {s: v for s, v in losses(single).items() if s > 3})


@pytest.mark.slow
def test_one_process_checkpoint_resumes_on_two_fsdp_ranks(ws, single):
    """1 -> 2: a single-file checkpoint loads into the sharded model (each rank keeps its shard)."""
    resumed = train(ws, "one-to-fsdp", "distributed.strategy=fsdp", "data.batch_size=4", "--resume",
                    str(single / "checkpoints" / "step-00000003.pt"))
    assert_close(losses(resumed), {s: v for s, v in losses(single).items() if s > 3})


def _dcp_model(directory: Path, tmp: Path) -> dict:
    """A sharded checkpoint's model weights as one state dict (DCP's own converter)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{directory.parent.parent.name}.pt"
    dcp_to_torch_save(directory, out)
    return torch.load(out, weights_only=True)["model"]


@pytest.mark.slow
def test_fsdp_accumulation_without_sync_matches_the_synced_run(ws, single, fsdp, tmp_path):
    """2 ranks x 2 micro-batches of 2, reduce-scatter skipped on the first micro-batch
    (set_requires_gradient_sync(False)): the same losses as one process with batch 8, and the
    same final weights as the FSDP run that syncs its one micro-batch of 4."""
    run = train(ws, "fsdp-accum", "distributed.strategy=fsdp", "data.batch_size=2", "accumulation.steps=2")
    assert_close(losses(run), losses(single))
    mine = _dcp_model(run / "checkpoints" / "step-00000006.dcp", tmp_path)
    synced = _dcp_model(fsdp / "checkpoints" / "step-00000006.dcp", tmp_path)
    assert mine.keys() == synced.keys() and len(mine) > 4
    for key in mine:
        assert torch_allclose(mine[key], synced[key]), key


def torch_allclose(a, b) -> bool:
    import torch

    return bool(torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-6))


def _wait_for(path: Path, proc: subprocess.Popen, limit: float = 90.0) -> None:
    t0 = time.monotonic()
    while not (path.exists() and path.stat().st_size > 0):
        if proc.poll() is not None or time.monotonic() - t0 > limit:
            out = proc.communicate()[0] if proc.poll() is not None else ""
            pytest.fail(f"training never started (rc {proc.poll()}): {out[-3000:]}")
        time.sleep(0.2)


@pytest.mark.slow
def test_killed_rank_under_torchrun_ends_the_job_quickly(ws):
    import psutil

    command = cmd(ws, "killed", ["distributed.strategy=ddp", "data.batch_size=4", "run.max_steps=100000",
                              "distributed.timeout_s=20", "checkpoint.every_steps=null", "--no-report"], 2)
    proc = subprocess.Popen(command, env=env(ws), cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(ws / "runs" / "killed" / "steps.jsonl", proc)
        def rank_of(child: psutil.Process) -> str | None:
            try:
                return child.environ().get("RANK")
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                return None

        rank1 = [c for c in psutil.Process(proc.pid).children(recursive=True) if rank_of(c) == "1"]
        assert rank1, "rank 1 not found among torchrun's children"
        for child in rank1:  # rank 1 and any helper process it started
            child.send_signal(signal.SIGKILL)
        t_kill = time.monotonic()
        out = proc.communicate(timeout=60)[0]
        elapsed = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert elapsed < 20, f"the job took {elapsed:.1f} s to end after the kill"
    # torchrun names the rank that failed first and why
    root = out.split("Root Cause")[-1]
    assert "rank      : 1" in root and "SIGKILL" in root, out[-3000:]


@pytest.mark.slow
def test_killed_peer_without_an_agent_is_a_clear_error_within_the_timeout(ws):
    """srun-style launch (no torchrun agent to tear the job down): rank 0 finds out from the
    failing collective and says so, instead of hanging."""
    port = free_port()
    command = [sys.executable, "-m", "trainspeed", "train", "gpt", *TINY, f"run.out_dir={ws / 'runs'}",
           "run.name=peer-killed", "distributed.strategy=ddp", "data.batch_size=4",
           "run.max_steps=100000", "distributed.timeout_s=15", "checkpoint.every_steps=null", "--no-report"]
    base = {**env(ws), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    procs = [subprocess.Popen(command, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd=ws,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    try:
        _wait_for(ws / "runs" / "peer-killed" / "steps.jsonl", procs[0])
        procs[1].send_signal(signal.SIGKILL)
        t_kill = time.monotonic()
        out = procs[0].communicate(timeout=60)[0]
        elapsed = time.monotonic() - t_kill
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert procs[0].returncode == 2, out[-3000:]
    assert elapsed < 15 + 10
    assert "trainspeed: error: DistributedError: rank 0 of 2:" in out
    assert "Another rank probably died or stalled for longer than distributed.timeout_s=15" in out
    report = json.loads((ws / "runs" / "peer-killed" / "report.json").read_text())
    assert "DistributedError" in report["traceback"]
