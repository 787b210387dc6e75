"""What the doctor got wrong on a real third-party DeepSpeed script, and keeps right now.

The script: DeepSpeedExamples' training/HelloDeepSpeed/train_bert_ds.py (microsoft/
DeepSpeedExamples@83757d9), run unchanged on the CPU (docs/real-scripts-deepspeed.md). Its
DeepSpeed config is a dict built in the code (ZeRO-1, bf16, offload_optimizer to the CPU), and
it saves with `engine.save_checkpoint(save_dir=..., client_state=...)`, no tag. Found there:

- on an engine that trains on the CPU (DS_ACCELERATOR=cpu), the offload to "cpu" was flagged as
  ZeRO beyond what the memory needs, "the step time should drop" without it; measured side by
  side on that model, engine.step took 9.5 / 43.7 ms with the offload (DeepSpeedCPUAdam) against
  73.7 / 99.9 ms without it (FusedAdam), the whole step the same within the machine's noise;
- advice said "the DeepSpeed config", with no file to open: the dict is at the script's
  deepspeed.initialize call, which advice now names;
- a checkpoint saved without a tag was recorded as the save_dir, not the global_stepN folder
  DeepSpeed writes.

tests/assets/scripts/deepspeed_hello_style.py has the same DeepSpeed usage, small and offline.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_checks import ctx_of, make_run
from test_deepspeed_script import _events, _observation, deepspeed_env  # noqa: F401 - the fixture

from doctor_helpers import SCRIPTS
from trainspeed.doctor.checks import deepspeed as checks

GIB = 1 << 30
HELLO = {"kind": "deepspeed", "zero_stage": 1, "bf16": True, "fp16": False, "torch_autocast": False,
         "offload_optimizer": "cpu", "offload_param": False, "dp_world_size": 1, "micro_batch_size": 8,
         "accumulation_steps": 1, "train_batch_size": 8, "basic_optimizer": "DeepSpeedCPUAdam",
         "params": 3_425_970, "device": "cpu", "device_memory": 24 * GIB, "device_memory_of": "machine RAM",
         "memory_shared_by": 1, "config": None}
"""The engine observation of train_bert_ds.py at --num_layers 2 --h_dim 64 --ff_dim 128."""
INIT = {"kind": "deepspeed_initialize", "config": "dict", "site": "train_bert_ds.py:801"}


def _ctx(*obs: dict):
    return ctx_of(make_run(shares={"forward": 0.4, "backward": 0.55, "optimizer": 0.03}, obs=list(obs)))


@pytest.mark.timeout(60)
def test_offload_to_cpu_on_a_cpu_engine_is_no_finding():
    assert checks.zero_beyond_memory(_ctx(HELLO, INIT)) is None
    # NVMe is a real move off the memory the engine trains in, on a CPU engine too
    assert checks.zero_beyond_memory(_ctx(dict(HELLO, offload_optimizer="nvme"), INIT)) is not None
    # ZeRO-3 on the CPU is still named, its offload to cpu said to be left as is
    found = checks.zero_beyond_memory(_ctx(dict(HELLO, zero_stage=3), INIT))
    assert found is not None and found.title.startswith("ZeRO stage 3 on a model whose training state fits in")
    assert "(offload_optimizer to cpu left as is: this engine trains on the CPU" in found.evidence
    assert "offload_optimizer" not in found.recommendation


@pytest.mark.timeout(60)
def test_the_same_offload_on_a_gpu_engine_is_named_at_the_initialize_call():
    gpu = dict(HELLO, device="cuda", device_memory=80 * GIB, device_memory_of="NVIDIA H100 80GB HBM3 memory")
    found = checks.zero_beyond_memory(_ctx(gpu, INIT))
    assert found is not None and found.title.startswith("ZeRO stage 1 with the optimizer offloaded to cpu")
    # the config is a dict in the code: advice names where it is built, not a file
    assert found.recommendation.startswith("in the DeepSpeed config dict passed to deepspeed.initialize at "
                                           "train_bert_ds.py:801: remove \"offload_optimizer\"")
    # a file (or --deepspeed_config) still wins over the call site
    named = checks.zero_beyond_memory(_ctx(dict(gpu, config="ds.json"), INIT))
    assert named.recommendation.startswith("in the DeepSpeed config (ds.json):")
    # without the observation (older run directories): as before
    assert checks.config_name(_ctx(gpu), gpu) == "the DeepSpeed config"


@pytest.mark.timeout(180)  # ~10 s of CPU (torch, DeepSpeed, its op, 10 steps): 55 s of wall ran out at load 20
def test_hello_style_script_under_the_doctor(deepspeed_env, tmp_path):  # noqa: F811
    """As a user runs it, in a process of its own (DeepSpeed caches its process groups in module
    globals: an in-process run after another module's destroyed group would find them stale)."""
    script = SCRIPTS / "deepspeed_hello_style.py"
    save_dir, run_dir = tmp_path / "exp", tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "trainspeed", "doctor", "--steps", "10", "--out", str(run_dir),
                           "--no-html", "--", "python", str(script), "--checkpoint_dir", str(save_dir),
                           "--checkpoint_every", "4", "--log_every", "5"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["summary"]["steps"] == 10 and report["summary"]["precision"] == "bf16", report.get("traceback")
    engine = _observation(run_dir, "deepspeed")
    assert engine["device"] == "cpu" and engine["offload_optimizer"] == "cpu" and engine["zero_stage"] == 1
    assert "deepspeed_zero_beyond_memory" not in [f["id"] for f in report["findings"]]
    init = _observation(run_dir, "deepspeed_initialize")
    line = next(n for n, text in enumerate(script.read_text().splitlines(), 1) if "= deepspeed.initialize(" in text)
    assert init["config"] == "dict" and init["site"].endswith(f"deepspeed_hello_style.py:{line}")
    # one checkpoint per save_checkpoint call, shown as the folder DeepSpeed wrote (its default tag)
    saves = [e for e in _events(run_dir) if e["type"] == "checkpoint"]
    assert [e["data"]["path"] for e in saves] == [str(save_dir / f"global_step{k}") for k in (4, 8)]
    assert sorted(p.name for p in save_dir.iterdir() if p.is_dir()) == ["global_step4", "global_step8"]
