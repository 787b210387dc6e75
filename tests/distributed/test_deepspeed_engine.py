"""distributed.strategy=deepspeed end to end on the CPU (DeepSpeed with DS_ACCELERATOR=cpu, gloo),
launched as users do: torchrun with 2 processes, or plain `python -m trainspeed train` for one.

The references are the ones of test_torchrun.py: without dropout, 2 ranks x batch 4 see the
same 8 samples per step as one process with batch 8, so ZeRO-2 in fp32 must give the same loss
curve to float rounding. bf16 is checked against itself (a killed and auto-resumed run against
an uninterrupted one), since its rounding differs from fp32's by design.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_helpers import TINY, assert_close, cmd, env, losses
from trainspeed.telemetry.rundir import read_run
from trainspeed.telemetry.summary import summarize

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
EXTENSIONS = ROOT / ".cache" / "torch_extensions"
ZERO2 = ["distributed.strategy=deepspeed", "distributed.zero_stage=2"]


@pytest.fixture(scope="module")
def ws(shared_dir, built_once):
    """Token cache built once; DeepSpeed's CPU op built (or found) once, where `make venv` puts
    it, with the venv's ninja first on PATH (another ninja would rebuild it). Shared by the
    session's workers, as are the runs below (built_once, tests/conftest.py)."""
    pytest.importorskip("deepspeed")
    return built_once("ds-ws", lambda: _workspace(shared_dir / "ds"))


def _workspace(root: Path) -> Path:
    from trainspeed.recipes.gpt import data as gdata

    root.mkdir(exist_ok=True)
    gdata.load_tokens(directory=root / "cache")
    if list((EXTENSIONS / "deepspeed_shm_comm").glob("*.so")):
        return root  # built: the runs load it (an interpreter importing deepspeed saved, 3-5 s on 2 cores)
    build = subprocess.run([sys.executable, "-c", "from deepspeed.comm.torch import build_shm_op; build_shm_op()"],
                           env=ds_env(root), capture_output=True, text=True, timeout=600)
    if build.returncode:
        pytest.skip(f"DeepSpeed's CPU op does not build here: {build.stderr.strip().splitlines()[-1:]}")
    return root


def ds_env(ws: Path) -> dict[str, str]:
    return {**env(ws), "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(EXTENSIONS),
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}


def train(ws: Path, name: str, *overrides: str, nproc: int = 2) -> Path:
    proc = subprocess.run(cmd(ws, name, [*overrides, "--no-report"], nproc), env=ds_env(ws), cwd=ws,
                          capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return ws / "runs" / name


def events(run: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    return [r["data"] for r in rows if r["type"] == kind]


@pytest.fixture(scope="module")
def single(ws, built_once):
    return built_once("ds-single", lambda: train(ws, "single", "data.batch_size=8", nproc=1))


@pytest.fixture(scope="module")
def zero2(ws, built_once):
    return built_once("ds-zero2", lambda: train(ws, "zero2", *ZERO2, "data.batch_size=4"))


def test_two_rank_zero2_matches_one_process_with_double_batch(single, zero2):
    ref = losses(single)
    assert len(ref) == 6 and len(set(ref.values())) > 1
    assert_close(losses(zero2), ref)  # gradient_clipping=1.0 (fast.yaml) sees the global norm
    assert losses(zero2, rank=1) == losses(zero2)
    notes = [e["message"] for e in events(zero2, "note")]
    assert "DeepSpeed ZeRO stage 2, fp32, 2 rank(s), micro-batch 4 x 1 accumulation" in notes
    # the engine's settings as the DeepSpeed checks read them (the doctor records the same)
    engine = [o for o in events(zero2, "observation") if o["kind"] == "deepspeed"]
    assert len(engine) == 1 and engine[0]["trainspeed_engine"] is True
    assert (engine[0]["zero_stage"], engine[0]["dp_world_size"], engine[0]["micro_batch_size"]) == (2, 2, 4)


def test_checkpoints_are_deepspeed_directories_published_with_a_marker(zero2):
    from trainspeed.engine.checkpoint import find_resumable, list_checkpoints
    from trainspeed.engine.checkpoint.sharded import verify_dir

    ckpts = zero2 / "checkpoints"
    assert [i.path.name for i in list_checkpoints(ckpts)] == ["step-00000003.ds", "step-00000006.ds"]
    marker = verify_dir(ckpts / "step-00000006.ds")
    assert marker["format"] == "deepspeed" and marker["world_size"] == 2 and marker["zero_stage"] == 2
    # DeepSpeed's module file, one ZeRO partition per rank, its own fp32 converter
    assert {"deepspeed/mp_rank_00_model_states.pt", "deepspeed/zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "deepspeed/zero_pp_rank_1_mp_rank_00_optim_states.pt", "zero_to_fp32.py"} <= marker["files"].keys()
    assert find_resumable(ckpts) == ckpts / "step-00000006.ds"
    saves = events(zero2, "checkpoint")
    assert [s["ckpt_step"] for s in saves] == [3, 6] and not any(s["async"] for s in saves)
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".")]  # no temp directory left


@pytest.mark.parametrize("stage", [2, 3])
def test_a_two_rank_checkpoint_resumes_on_one_process_through_the_universal_form(ws, single, zero2, stage):
    """ZeRO-3 also checks the repairs of DeepSpeed's ZeRO-3 universal load (deepspeed_io.py):
    without them the second resumed step drifted (weight decay on the no-decay group, Adam's
    step counted once per sub-group)."""
    saved = zero2 if stage == 2 else train(ws, "zero3", "distributed.strategy=deepspeed",
                                           "distributed.zero_stage=3", "data.batch_size=4")
    resumed = train(ws, f"zero{stage}-on-one", "distributed.strategy=deepspeed", f"distributed.zero_stage={stage}",
                    "data.batch_size=8", "--resume", str(saved / "checkpoints" / "step-00000003.ds"), nproc=1)
    assert_close(losses(resumed), {s: v for s, v in losses(single).items() if s > 3})
    assert not [p for p in (saved / "checkpoints").iterdir() if "universal" in p.name]


def test_killed_bf16_run_auto_resumes_on_the_uninterrupted_curve(ws):
    """SIGKILL to torchrun and both ranks once the first checkpoint is published; the rerun of
    the same command with auto_resume continues from the newest intact checkpoint on the curve
    of an uninterrupted run. (Where the kill lands is up to the machine: the step records lag
    the training by a flush, and either checkpoint is a fair start.)"""
    bf16 = [*ZERO2, "precision.mode=bf16-mixed", "data.batch_size=4", "run.max_steps=12",
            "checkpoint.every_steps=5", "checkpoint.keep_last=2"]
    reference = losses(train(ws, "bf16-reference", *bf16))
    run = ws / "runs" / "bf16-killed"
    _kill_once_a_checkpoint_is_published(ws, run, [*bf16, "--no-report"])
    train(ws, "bf16-killed", *bf16, "checkpoint.auto_resume=true")
    restart = events(run, "restart")
    assert restart and restart[-1]["path"].endswith(".ds")
    at = restart[-1]["at_step"]
    assert at in (5, 10)
    resumed = {s: v for s, v in losses(run).items() if s > at}  # its records come last and win
    assert sorted(resumed) == list(range(at + 1, 13))
    assert_close(resumed, {s: v for s, v in reference.items() if s > at})
    assert len(set(reference.values())) > 5 and reference[12] < reference[1]  # it trains
    # the engine's bf16 section (weights in bf16, fp32 master copy): what the summary reads back
    assert [e["precision"] for e in events(ws / "runs" / "bf16-reference", "precision")] == ["bf16"]
    assert summarize(read_run(ws / "runs" / "bf16-reference"))["precision"] == "bf16"


def _kill_once_a_checkpoint_is_published(ws: Path, run: Path, overrides: list[str]) -> None:
    """SIGKILL to the whole launch while it trains. A launch that ends before the first checkpoint
    is either a lost port race (free_port hands out a port another worker's launch may take first)
    or a crash: the first is tried again, the second fails with the launch's own output."""
    for attempt in range(3):
        shutil.rmtree(run, ignore_errors=True)
        log = ws / f"bf16-killed-{attempt}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(cmd(ws, run.name, overrides, 2), env=ds_env(ws), cwd=ws,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 150
            while proc.poll() is None and time.monotonic() < deadline \
                    and not (run / "checkpoints" / "step-00000005.ds").exists():
                time.sleep(0.01)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # no save on the way out
            except ProcessLookupError:
                pass  # the group had already ended: judged below
        finally:
            proc.wait(timeout=30)
        if proc.returncode == -signal.SIGKILL:
            return
        output = log.read_text()
        if "address already in use" not in output.lower() and "EADDRINUSE" not in output:
            raise AssertionError(f"the launch ended by itself (exit {proc.returncode}) before it could be "
                                 f"killed:\n{output[-3000:]}")
    raise AssertionError("three launches in a row lost their port")


def test_contradicting_json_is_refused_before_training(ws, tmp_path):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}))
    proc = subprocess.run(cmd(ws, "contradiction", ["distributed.strategy=deepspeed",
                                                    f"distributed.deepspeed={config}"], 1),
                          env=ds_env(ws), cwd=ws, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert ("the DeepSpeed config enables bf16 but precision.mode='fp32'. Keep one: set "
            "precision.mode=bf16-mixed") in proc.stderr
    assert not (ws / "runs" / "contradiction" / "steps.jsonl").exists()


CRASHING = '''
import sys
import torch
from torch import nn
from trainspeed import Trainer

calls = {"n": 0}

def loss_fn(model, batch):
    calls["n"] += 1
    if calls["n"] == 5:  # the FLOP count's forward, then steps 1-3 pass; step 4 fails
        raise ValueError("planted failure in loss_fn")
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)

torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
cfg = {"run": {"max_steps": 10, "out_dir": sys.argv[1], "name": "crash", "device": "cpu"},
       "data": {"batch_size": 4}, "logging": {"progress": False},
       "distributed": {"strategy": "deepspeed", "zero_stage": 2},
       "checkpoint": {"every_steps": 2, "save_on_crash": True}}
Trainer(nn.Linear(8, 2), loss_fn, data, config=cfg).fit()
'''


def test_the_python_api_saves_a_deepspeed_checkpoint_when_training_crashes(ws, tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASHING)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "runs")], env=ds_env(ws),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "ValueError: planted failure in loss_fn" in proc.stderr
    run = tmp_path / "runs" / "crash"
    saves = [(s["ckpt_step"], s["reason"]) for s in events(run, "checkpoint")]
    assert saves == [(2, "periodic"), (3, "crash")]
    from trainspeed.engine.checkpoint.sharded import verify_dir

    assert verify_dir(run / "checkpoints" / "step-00000003.ds")["zero_stage"] == 2
