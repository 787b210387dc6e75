"""The doctor on an unchanged DeepSpeed script (ZeRO-2, bf16, CPU with DS_ACCELERATOR=cpu, gloo).

tests/assets/scripts/deepspeed_train.py is written the way DeepSpeed scripts are (argparse with
--deepspeed_config, deepspeed.initialize, engine(x) / engine.backward / engine.step,
engine.save_checkpoint every --save-every steps); deepspeed_config.json sits next to it.

DeepSpeed JIT-builds a small op (the CPU shared-memory allreduce) the first time a process
group starts: the build (minutes on 2 cores) lives in .cache/torch_extensions at the repository
root, reused across test sessions (`make venv` builds it once after installing DeepSpeed, with
the venv's ninja first on PATH, as the tests run it).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainspeed.telemetry.rundir import read_run
from trainspeed.telemetry.summary import summarize

from doctor_helpers import SCRIPTS, ids

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = SCRIPTS / "deepspeed_train.py"
CONFIG = SCRIPTS / "deepspeed_config.json"
EXTENSIONS = ROOT / ".cache" / "torch_extensions"

pytestmark = pytest.mark.timeout(300)


def _line_of(text: str) -> int:
    """The line of the test script that holds `text`."""
    for number, line in enumerate(SCRIPT.read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {SCRIPT}")


def _build_op_once() -> None:
    """Build (or load from EXTENSIONS) DeepSpeed's CPU op before any run needs it, once per
    session; a build that cannot happen skips the tests instead of failing each run."""
    lock = EXTENSIONS / "deepspeed_shm_comm" / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > 900:
        lock.unlink()  # left by a build that was killed: torch would wait on it forever
    try:
        from deepspeed.comm.torch import build_shm_op

        build_shm_op()
    except Exception as exc:  # noqa: BLE001 - no compiler, no headers: nothing to test here
        pytest.skip(f"DeepSpeed's CPU op does not build here: {type(exc).__name__}: {exc}")


@pytest.fixture(scope="module")
def deepspeed_env():
    """DeepSpeed on the CPU (gloo), its op build cached across sessions; the process group the
    in-process runs start is destroyed after the module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS_ACCELERATOR", "cpu")
        mp.setenv("TORCH_EXTENSIONS_DIR", str(EXTENSIONS))
        # the venv's ninja (a DeepSpeed dependency) first, as `make venv` builds with it: another
        # ninja version logs commands under other hashes and rebuilds the op (a minute on 2 cores)
        mp.setenv("PATH", os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
        pytest.importorskip("deepspeed")
        _build_op_once()
        yield
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture
def ds_doctor(doctor, deepspeed_env, tmp_path):
    def run(*args: str, steps: int = 16):
        return doctor("deepspeed_train.py", "--deepspeed_config", str(CONFIG), "--save-dir",
                      str(tmp_path / "ckpt"), *args, steps=steps)

    return run


@pytest.mark.slow  # 10-40 s: started first under xdist (tests/conftest.py)
def test_checkpoint_every_two_steps_is_ranked_first(ds_doctor, tmp_path):
    result = ds_doctor("--save-every", "2", steps=16)
    assert result.stopped == "steps" and result.steps == 16, result.traceback
    first = result.findings[0]
    assert first["id"] == "checkpointing", ids(result)
    # one save per engine.save_checkpoint call (each writes 2 torch.save files: module + ZeRO state)
    tags = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.is_dir())
    saves = [e for e in _events(result.run_dir) if e["type"] == "checkpoint"]
    # steps are DeepSpeed's updates (its global_steps): ZeRO steps the torch AdamW underneath once
    # per parameter group (2 here), which must not count twice; the run stops at 16 before saving
    assert set(tags) == {f"step{k}" for k in range(2, 16, 2)}
    assert len(saves) == len(tags) == 7
    assert {e["data"]["source"] for e in saves} == {"deepspeed.save_checkpoint"}
    assert all(e["data"]["files"] >= 2 for e in saves)
    assert first["evidence"].startswith("7 saves in 16 steps (every 2 steps)")
    # the site is the script's own line, with DeepSpeed's beside it
    assert f"deepspeed_train.py:{_line_of('engine.save_checkpoint(')}" in first["evidence"]
    assert "(inside deepspeed/runtime/engine.py:" in first["evidence"]
    # the script's own flag, and a verify command that runs the script (no CONFIG.yaml)
    # the interval keeps saving under 5 % of the time: its value follows save time / step time,
    # which a loaded machine moves (50 or 100 quiet, 20 seen under load), never the current 2
    suggested = re.search(r"save less often: --save-every (\d+) ", first["recommendation"])
    assert suggested and int(suggested.group(1)) >= 10, first["recommendation"]
    assert "(now --save-every 2)" in first["recommendation"]
    assert "checkpoint.every_steps" not in first["recommendation"]
    verify = _as_exported(first["verify_with"])
    assert verify[:5] == ["trainspeed", "tune", "--knobs", "checkpoint_every", "--"]
    assert verify[5:8] == ["python", str(SCRIPT), "--deepspeed_config"]
    assert not any("CONFIG.yaml" in str(f.get("verify_with")) for f in result.findings)
    _runs_as_written(verify, tmp_path)
    # DeepSpeed's own step reads values (overflow, norms): not the script's host syncs; the one
    # left is the script's `loss.item()` every --log-every 10 steps
    assert not [f for f in result.findings if f["id"] == "host_syncs" and f["severity"] != "info"]
    syncs = [r for r in _observation(result.run_dir, "call_sites")["rows"] if r["category"] == "sync"]
    assert [(r["site"].rsplit("/", 1)[-1], r["count"]) for r in syncs] == [
        (f"deepspeed_train.py:{_line_of('loss.item()')}", 1)]
    # steps are the engine's updates: 2 engine.backward per step (gradient_accumulation_steps=2)
    acc = _observation(result.run_dir, "accumulation")
    assert acc["factor"] == 2 and acc["counts"] == {"2": 16}
    assert _observation(result.run_dir, "step_boundary")["source"] == "engine"
    phases = result.summary["phases"]
    for name in ("forward", "backward", "optimizer", "ckpt", "data"):
        assert phases[name]["share"] > 0, name
    engine = _observation(result.run_dir, "deepspeed")
    assert engine["zero_stage"] == 2 and engine["bf16"] and engine["accumulation_steps"] == 2
    # the run trained in the engine's bf16 (the Monitor started before the script chose: fp32)
    assert result.summary["precision"] == "bf16"
    assert json.loads((result.run_dir / "report.json").read_text())["summary"]["precision"] == "bf16"
    # and so does the run directory read again later (trainspeed report, compare)
    assert summarize(read_run(result.run_dir))["precision"] == "bf16"
    # ZeRO-2 without offloading on one process: nothing beyond what the memory needs
    assert "deepspeed_zero_beyond_memory" not in ids(result)


@pytest.mark.slow  # 10-40 s: started first under xdist (tests/conftest.py)
def test_zero3_with_offload_on_a_model_that_fits_is_named(doctor, deepspeed_env, tmp_path):
    """The same script with ZeRO-3 and the optimizer offloaded to the CPU: its 4.2 M parameters'
    whole training state (64.6 MiB) fits in a sliver of the machine's RAM."""
    config = {**json.loads(CONFIG.read_text()),
              "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    path = tmp_path / "zero3.json"
    path.write_text(json.dumps(config))
    result = doctor("deepspeed_train.py", "--deepspeed_config", str(path), "--save-every", "1000",
                    "--save-dir", str(tmp_path / "ckpt"), steps=6)
    assert result.steps == 6, result.traceback
    engine = _observation(result.run_dir, "deepspeed")
    # whole parameters, though ZeRO-3 leaves each rank a partition (p.numel() is 0 outside a forward)
    assert engine["params"] == 4_235_648 and engine["offload_optimizer"] == "cpu"
    assert engine["device_memory_of"] == "machine RAM" and engine["memory_shared_by"] == 1
    assert engine["device"] == "cpu"
    found = [f for f in result.findings if f["id"] == "deepspeed_zero_beyond_memory"]
    assert len(found) == 1 and found[0]["severity"] == "warning", ids(result)
    # the engine trains on the CPU: its offload to cpu moves nothing, and is not advised away
    assert found[0]["title"].startswith("ZeRO stage 3 on a model whose training state fits in 0.")
    assert "offload_optimizer to cpu left as is: this engine trains on the CPU" in found[0]["evidence"]
    assert "whole training state is 64.6 MiB (4,235,648 parameters x 16 bytes" in found[0]["evidence"]
    assert "(32.3 MiB of weights per step over 2 micro-batches)" in found[0]["evidence"]
    assert f"in the DeepSpeed config ({path}): set \"stage\": 0 in \"zero_optimization\" (the key " \
           "zero_optimization.stage)" in found[0]["recommendation"]
    assert "offload_optimizer" not in found[0]["recommendation"]
    # verified by the script's tune of the ZeRO stage (an edited copy of zero3.json per trial)
    verify = _as_exported(found[0]["verify_with"])
    assert verify[:5] == ["trainspeed", "tune", "--knobs", "zero_stage", "--"]
    before = path.read_bytes()
    _runs_as_written(verify, tmp_path, "zero_stage=0")
    assert result.summary["precision"] == "bf16"
    # the script's real tune of the ZeRO stage (tests/tune/test_deepspeed_knobs.py ran one more,
    # from the ZeRO-2 JSON: merged here): each trial ran the stage its row names, through an
    # edited copy of zero3.json that keeps its offload; the user's file was only read
    trials = [json.loads(line) for line in (tmp_path / "tune" / "tune.jsonl").read_text().splitlines()]
    seen = {t["label"]: _observation(Path(t["run_dir"]), "deepspeed")["zero_stage"]
            for t in trials if t["ok"] and t["repeat"] == 0}
    assert seen == {"baseline": 3, **{f"zero_stage={k}": k for k in (0, 1, 2) if f"zero_stage={k}" in seen}}, seen
    assert path.read_bytes() == before
    # the baseline trial recorded DeepSpeed's modules: the fork server imported them for the
    # trials after it (each imported DeepSpeed and inductor itself before, ~3 s a trial)
    from trainspeed.tune.script_facts import read_facts

    baseline = next(Path(t["run_dir"]) for t in trials if t["label"] == "baseline" and t["ok"])
    assert {"deepspeed", "deepspeed.runtime.engine"} <= set(read_facts(baseline).modules)
    copies = [json.loads(c.read_text())["zero_optimization"]
              for c in (tmp_path / "tune" / "trials" / ".plans").glob("*.deepspeed.json")]
    assert sorted(c["stage"] for c in copies) == sorted(v for k, v in seen.items() if k != "baseline")
    assert all(c["offload_optimizer"] == {"device": "cpu"} for c in copies)


def _as_exported(command: str) -> list[str]:
    """The words of a printed command after the variable this module exports (deepspeed_env),
    which the doctor carries in front of it as the user's run had it (doctor/instrument/run_env.py)."""
    words = shlex.split(command)
    assert words[0] == f"TORCH_EXTENSIONS_DIR={EXTENSIONS}", command
    return words[1:]


def _runs_as_written(verify: list[str], tmp_path: Path,
                     setting: str = "checkpoint_every=--save-every 8") -> None:
    """The verify command, with one short trial per setting (--max-rounds 1: none of the extra
    rounds the budget buys for undecided settings), runs the script's tune and measures
    the setting the finding names. One baseline bracket and no final check: each extra trial is
    another DeepSpeed engine start (the assertion reads the ablation's trials). The trials'
    count and length fix the work; the budget is set where it never binds: at 120 s a baseline
    trial of 81 s on a loaded machine (load 15 on 2 cores) left every setting "does not fit the
    budget" and the tune exited 3."""
    tiny = ["--repeats", "1", "--max-rounds", "1", "--warmup-steps", "2", "--steps", "6", "--verify-repeats", "0",
            "--baseline-every", "10", "--budget", "30m", "--out", str(tmp_path / "tune")]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "trainspeed", "tune", *tiny, *verify[2:]], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trials = [json.loads(line) for line in (tmp_path / "tune" / "tune.jsonl").read_text().splitlines()]
    assert {t["label"] for t in trials if t["ok"]} >= {"baseline", setting}, [t["label"] for t in trials]


def test_autocast_around_a_bf16_engine_is_named(ds_doctor):
    result = ds_doctor("--save-every", "1000", "--autocast", steps=8)
    assert result.steps == 8, result.traceback
    found = [f for f in result.findings if f["id"] == "deepspeed_autocast"]
    assert len(found) == 1, ids(result)
    assert f"deepspeed_train.py:{_line_of('loss = engine(bigrams, targets)')}" in found[0]["evidence"]
    assert "bf16" in found[0]["title"] and str(CONFIG) in found[0]["evidence"]
    assert "checkpointing" not in ids(result)


def test_one_process_env_only_without_a_launcher():
    from trainspeed.doctor.instrument.deepspeed import one_process_env

    add = one_process_env({})
    assert add["RANK"] == "0" and add["WORLD_SIZE"] == "1" and add["LOCAL_RANK"] == "0"
    assert int(add["MASTER_PORT"]) > 0
    assert one_process_env({"RANK": "1", "WORLD_SIZE": "2"}) == {}
    assert one_process_env({"OMPI_COMM_WORLD_SIZE": "2"}) == {}
    assert "MASTER_PORT" not in one_process_env({"MASTER_PORT": "1234"})


def test_config_contradictions_from_the_engine_settings():
    from test_checks import ctx_of, make_run

    from trainspeed.doctor.checks import deepspeed as checks

    engine = {"kind": "deepspeed", "zero_stage": 2, "bf16": True, "overlap_comm": False,
              "contiguous_gradients": True, "dp_world_size": 2, "micro_batch_size": 8,
              "accumulation_steps": 2, "train_batch_size": 32}
    obs = [engine, {"kind": "batch", "batch_size": 32}, {"kind": "accumulation", "factor": 2}]
    ctx = ctx_of(make_run(shares={"backward": 0.5, "forward": 0.3}, obs=obs))
    overlap = checks.zero2_overlap(ctx)
    assert overlap is not None and "overlap_comm" in overlap.title and '"overlap_comm": true' in overlap.recommendation
    mismatch = checks.batch_mismatch(ctx)
    assert mismatch is not None and "32 samples" in mismatch.evidence and "128 samples per update" in mismatch.evidence
    one = dict(engine, dp_world_size=1)
    ctx1 = ctx_of(make_run(shares={"backward": 0.5}, obs=[one]))
    assert checks.zero2_overlap(ctx1) is None  # one process: nothing to overlap


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # 10-40 s: started first under xdist (tests/conftest.py)
@pytest.mark.timeout(180)
def test_two_processes_under_the_deepspeed_launcher(deepspeed_env, tmp_path):
    """ZeRO-2 over 2 CPU processes, the command as DeepSpeed users type it given to the doctor:
    it goes in under the launcher (`deepspeed ... --no_local_rank --module trainspeed doctor`),
    every rank runs the doctor, rank 0 reports. (It was refused with a form to fill in; the
    torchrun form it shares its code with runs in tests/distributed/test_doctor_ranks.py.)"""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "doc"
    launcher = ["deepspeed", "--num_gpus", "2", "--master_port", str(_free_port())]
    proc = subprocess.run(
        [sys.executable, "-m", "trainspeed", "doctor", "--steps", "8", "--out", str(out), "--no-html", "--",
         *launcher, str(SCRIPT), "--deepspeed_config", str(CONFIG), "--save-every", "2",
         "--save-dir", str(tmp_path / "ckpt")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert [r["steps"] for r in report["summary"]["ranks"]] == [8, 8]
    assert report["findings"][0]["id"] == "checkpointing"
    engine = _observation(out, "deepspeed")
    assert engine["dp_world_size"] == 2 and engine["train_batch_size"] == 32
    assert "one process" not in proc.stderr  # the launcher's environment is kept
    # two equal ranks on a shared 2-core machine: 7 measured steps are too few to call one slow
    assert "straggler" not in [f["id"] for f in report["findings"]]
    assert not any(r["straggler"] for r in report["summary"]["ranks"])
    # its verify commands come back in the form typed
    commands = [f["verify_with"] for f in report["findings"] if "trainspeed doctor" in str(f.get("verify_with"))]
    assert commands and all(c.startswith(f"TORCH_EXTENSIONS_DIR={EXTENSIONS} trainspeed doctor --steps 8 -- "
                                         f"{shlex.join(launcher)} {SCRIPT}")
                            for c in commands)  # the run's own length too


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def _observation(run_dir: Path, kind: str) -> dict:
    for event in _events(run_dir):
        if event["type"] == "observation" and event["data"].get("kind") == kind:
            return event["data"]
    raise AssertionError(f"no {kind} observation in {run_dir}")


def test_a_launcher_as_the_command_says_how_to_run_under_it():
    """The command shown is the user's own, with the doctor put in: runnable as printed (it used
    to read `deepspeed --num_gpus N ... --out RUN_DIR -- train.py ARGS`)."""
    from trainspeed.doctor.runner import parse_command
    from trainspeed.errors import ConfigError

    stem = SCRIPT.stem
    for argv, form in (
            (["deepspeed", "--num_gpus", "2", str(SCRIPT), "--deepspeed_config", "ds.json"],
             "deepspeed --num_gpus 2 --no_local_rank --module trainspeed doctor --out runs/doctor-" + stem),
            (["torchrun", "--nproc_per_node", "2", str(SCRIPT), "--lr", "1"],
             "torchrun --nproc_per_node 2 -m trainspeed doctor --out runs/doctor-" + stem)):
        with pytest.raises(ConfigError, match="one process per rank") as err:
            parse_command(argv)
        text = str(err.value)
        assert form in text and "trainspeed doctor -- python train.py" in text, text
        assert f" -- {SCRIPT} {' '.join(argv[-2:])} (rank 0" in text, text
    with pytest.raises(ConfigError, match="--nproc_per_node N"):  # not readable as torchrun's: the general form
        parse_command(["torchrun", "--num_gpus", "2", str(SCRIPT)])
