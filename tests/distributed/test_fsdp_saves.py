"""FSDP with 2 CPU processes (gloo) under torchrun, on a tiny Trainer script (fsdp_script.py):
signal and crash saves (which ones all ranks can join, and which they cannot), and gradient
accumulation without a reduce-scatter on the non-final micro-batches."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SCRIPT = Path(__file__).with_name("fsdp_script.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(out: Path, name: str, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_port", str(_free_port()), str(SCRIPT), str(out), name, *overrides]


def _env(**extra: str) -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra,
            "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def _events(run: Path, rank: int) -> list[dict]:
    path = run / "events.jsonl" if rank == 0 else run / "ranks" / f"rank{rank}" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _saves(run: Path) -> list[dict]:
    return [e["data"] for e in _events(run, 0) if e["type"] == "checkpoint"]


def wait_started(proc: subprocess.Popen, run: Path) -> None:
    """Until the run's first step record is written (or fail with the launch's output)."""
    t0 = time.monotonic()
    while not ((run / "steps.jsonl").exists() and (run / "steps.jsonl").stat().st_size > 0):
        if proc.poll() is not None or time.monotonic() - t0 > 90:
            pytest.fail(f"training never started: {proc.communicate()[0][-3000:]}")
        time.sleep(0.2)


def _crash(tmp_path: Path, name: str, ranks: str, *overrides: str) -> tuple[Path, str]:
    proc = subprocess.run(_cmd(tmp_path, name, *overrides), capture_output=True, text=True, timeout=100,
                          env=_env(TRAINSPEED_TEST_CRASH_AT="5", TRAINSPEED_TEST_CRASH_RANKS=ranks))
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "user loss_fn failed on call 5" in out, out[-3000:]
    return tmp_path / name, out


def test_a_crash_on_every_rank_saves_a_sharded_checkpoint(tmp_path):
    """loss_fn raises on both ranks in step 4 (call 1 is the FLOP count): both agree, and both
    write their shards of the state after step 3."""
    from trainspeed.engine.checkpoint import find_resumable
    from trainspeed.engine.checkpoint.sharded import verify_dir

    run, _ = _crash(tmp_path, "all", "0,1")
    ckpt = run / "checkpoints" / "step-00000003.dcp"
    marker = verify_dir(ckpt)
    assert marker["reason"] == "crash" and marker["world_size"] == 2
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(marker["files"])
    assert find_resumable(run / "checkpoints") == ckpt
    assert [(s["ckpt_step"], s["reason"]) for s in _saves(run)] == [(3, "crash")]


def test_a_crash_on_one_rank_saves_nothing_and_says_why(tmp_path):
    """Only rank 1 raises; rank 0 waits in a training collective and never joins the crash
    save, so rank 1 gives up after min(timeout_s, 30) s instead of writing half a checkpoint."""
    run, _ = _crash(tmp_path, "one", "1", "distributed.timeout_s=5")
    assert not any((run / "checkpoints").glob("step-*")), list((run / "checkpoints").iterdir())
    assert not any(p.name.startswith(".") for p in (run / "checkpoints").iterdir())  # no temp dir left
    skipped = [e["data"]["error"] for e in _events(run, 1) if e["data"].get("kind") == "crash_save_skipped"]
    assert len(skipped) == 1 and "not every rank joined the crash save within 5 s" in skipped[0]


def test_sigterm_from_torchrun_saves_with_every_rank(tmp_path):
    """torchrun forwards SIGTERM to every rank; the ranks agree at the next multiple of
    distributed.signal_check_every, all write their shards, and leave with 143."""
    from trainspeed.engine.checkpoint.sharded import verify_dir

    run = tmp_path / "sig"
    proc = subprocess.Popen(_cmd(tmp_path, "sig", "run.max_steps=100000", "distributed.signal_check_every=2"),
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_started(proc, run)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    saves = _saves(run)
    assert len(saves) == 1 and saves[0]["reason"] == "signal", out[-3000:]
    step = saves[0]["ckpt_step"]
    assert step % 2 == 0
    marker = verify_dir(run / "checkpoints" / f"step-{step:08d}.dcp")
    assert marker["step"] == step and {"__0_0.distcp", "__1_0.distcp"} <= set(marker["files"])
    for rank in (0, 1):
        exits = [e["data"] for e in _events(run, rank) if e["data"].get("kind") == "signal_exit"]
        assert exits == [{"kind": "signal_exit", "signal": "SIGTERM", "at_step": step}]


def test_accumulation_reduce_scatters_only_on_the_last_micro_batch(tmp_path):
    """3 FSDP units (2 blocks + the root's head) x 4 steps x 2 micro-batches: 12 gradient
    reduce-scatters instead of 24, plus 3 from the one-off FLOP-counting backward."""
    counts = tmp_path / "rs"
    proc = subprocess.run(_cmd(tmp_path, "accum", "run.max_steps=4", "accumulation.steps=2"),
                          capture_output=True, text=True, timeout=100, env=_env(TRAINSPEED_TEST_COUNT_RS=str(counts)))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert [int(counts.with_name(f"rs.{r}").read_text()) for r in (0, 1)] == [4 * 3 + 3] * 2
