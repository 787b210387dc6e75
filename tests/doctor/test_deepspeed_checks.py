"""DeepSpeed findings on hand-built observations (no DeepSpeed needed): ZeRO beyond what the
memory needs, a micro-batch that leaves GPU memory unused, and the engine's precision."""

from __future__ import annotations

import pytest
from test_checks import ctx_of, make_run

from trainspeed.doctor.checks import deepspeed as checks
from trainspeed.doctor.checks import diagnose
from trainspeed.doctor.runner import engine_precision_of, matmul_dtype

pytestmark = pytest.mark.timeout(60)

GIB = 1 << 30
PARAMS = 4_235_648
"""tests/assets/scripts/deepspeed_train.py's BigramLM."""
ENGINE = {"kind": "deepspeed", "zero_stage": 3, "bf16": True, "fp16": False, "torch_autocast": False,
          "offload_optimizer": "cpu", "offload_param": False, "dp_world_size": 1, "micro_batch_size": 8,
          "accumulation_steps": 2, "train_batch_size": 16, "basic_optimizer": "AdamW", "params": PARAMS,
          "device_memory": 24 * GIB, "device_memory_of": "machine RAM", "memory_shared_by": 1}
H100 = {"kind": "device", "type": "cuda", "name": "NVIDIA H100 80GB HBM3", "total_memory": 80 * GIB}


def _ctx(engine: dict, *extra: dict, peak: float | None = None, shares: dict | None = None):
    run = make_run(shares=shares or {"forward": 0.1, "backward": 0.6, "optimizer": 0.27}, obs=[engine, *extra])
    if peak is not None:
        for record in run.steps:
            record["mem"]["cuda_alloc_peak"] = peak
    return ctx_of(run)


def test_zero3_with_offload_on_a_model_that_fits_in_ram():
    found = checks.zero_beyond_memory(_ctx(ENGINE))
    assert found is not None and found.severity == "warning"
    assert found.title == ("ZeRO stage 3 with the optimizer offloaded to cpu on a model whose training state "
                           "fits in 0.3% of machine RAM")
    # 16 bytes per parameter: bf16 weights and gradients, fp32 master weights, AdamW's two moments
    assert "(4,235,648 parameters x 16 bytes: bf16 weights and gradients 2 + 2, fp32 master weights 4, " \
           "AdamW's state 8)" in found.evidence
    assert "whole training state is 64.6 MiB" in found.evidence and "of the 24.0 GiB of machine RAM" in found.evidence
    # what it costs: 2 gathers x 2 micro-batches x 8.1 MiB of bf16 weights; the copies of offloading
    assert "(32.3 MiB of weights per step over 2 micro-batches)" in found.evidence
    assert "forward and backward take 70% of step time" in found.evidence
    assert "with one process it partitions nothing" in found.evidence
    assert "copies the gradients to cpu and the updated weights back every step (16.2 MiB)" in found.evidence
    assert "the optimizer phase takes 27% of step time" in found.evidence
    # the fix, in the user's own config, by key
    assert found.recommendation.startswith('in the DeepSpeed config: set "stage": 0 in "zero_optimization" (the key '
                                           'zero_optimization.stage): one process has nothing to partition; ')
    assert 'remove "offload_optimizer" from "zero_optimization" (zero_optimization.offload_optimizer)' \
        in found.recommendation


def test_zero3_over_several_processes_is_told_stage_2():
    found = checks.zero_beyond_memory(_ctx(dict(ENGINE, dp_world_size=4, offload_optimizer=False)))
    assert found is not None and found.title.startswith("ZeRO stage 3 on a model")
    assert '"stage": 2 in "zero_optimization"' in found.recommendation
    assert "over the 4 processes" in found.recommendation and "offload" not in found.recommendation


def test_zero_beyond_memory_only_where_the_state_fits_with_room():
    fits = checks.zero_beyond_memory
    assert fits(_ctx(dict(ENGINE, zero_stage=2, offload_optimizer=False))) is None  # nothing beyond stage 2
    # 16 bytes/param: 20 % of the RAM fits, 30 % does not
    assert fits(_ctx(dict(ENGINE, params=int(0.20 * 24 * GIB / 16)))) is not None
    assert fits(_ctx(dict(ENGINE, params=int(0.30 * 24 * GIB / 16)))) is None
    # 2 processes on one machine share its RAM: 2 x 15 % is over the quarter
    assert fits(_ctx(dict(ENGINE, params=int(0.15 * 24 * GIB / 16)))) is not None
    assert fits(_ctx(dict(ENGINE, params=int(0.15 * 24 * GIB / 16), memory_shared_by=2))) is None
    # on a GPU, the measured peak counts: 5 GiB of state + a 70 GiB peak is over 80 % of 80 GiB
    gpu = dict(ENGINE, params=5 * GIB // 16, device_memory=80 * GIB, device_memory_of="NVIDIA H100 memory")
    assert fits(_ctx(gpu, H100, peak=20 * GIB)) is not None
    assert fits(_ctx(gpu, H100, peak=70 * GIB)) is None
    # no parameter count or no memory: nothing to weigh it against
    assert fits(_ctx(dict(ENGINE, params=None))) is None
    assert fits(_ctx(dict(ENGINE, device_memory=None))) is None


def test_state_bytes_follow_the_config():
    assert checks.state_bytes(ENGINE)[0] == 16
    assert checks.state_bytes(dict(ENGINE, bf16=False))[0] == 16  # fp32 Adam: 4 + 4 + 8
    assert checks.state_bytes(dict(ENGINE, bf16=False, basic_optimizer="SGD")) == (
        12, "fp32 weights and gradients 4 + 4, SGD's state 4")
    unknown = checks.state_bytes(dict(ENGINE, basic_optimizer=None))
    assert unknown[0] == 16 and unknown[1].endswith("an Adam-like optimizer's state 8, assumed")


MICRO = dict(ENGINE, zero_stage=2, offload_optimizer=False, accumulation_steps=1, train_batch_size=8,
             device_memory=80 * GIB, device_memory_of="NVIDIA H100 80GB HBM3 memory")


def test_micro_batch_that_leaves_gpu_memory_unused():
    found = checks.micro_batch_headroom(_ctx(MICRO, H100, {"kind": "accumulation", "factor": 1}, peak=6 * GIB))
    assert found is not None and found.severity == "info"
    assert found.title == "The micro-batch of 8 leaves 92% of NVIDIA H100 80GB HBM3 memory unused"
    assert found.evidence.startswith("peak allocated 6.0 GiB of 80.0 GiB (8%) with train_micro_batch_size_per_gpu=8, "
                                  "gradient_accumulation_steps=1 in the DeepSpeed config; ")
    # 8x the micro-batch needs at most 8x the peak: 48 GiB, 60 % (capped at 8x)
    assert "8x the micro-batch needs at most 8x the peak (60%)" in found.evidence
    assert found.recommendation.startswith('set "train_micro_batch_size_per_gpu": 64 (now 8)')
    assert '"train_batch_size": 64' in found.recommendation and "learning rate" in found.recommendation
    # 20 GiB: doubling (40 GiB) fits, 4x (80 GiB) does not
    found = checks.micro_batch_headroom(_ctx(MICRO, H100, peak=20 * GIB))
    assert '"train_micro_batch_size_per_gpu": 16 (now 8)' in found.recommendation


def test_micro_batch_headroom_only_on_cuda_with_memory_to_spare():
    headroom = checks.micro_batch_headroom
    assert headroom(_ctx(MICRO, H100, peak=40 * GIB)) is None  # 50 %: twice would not fit
    assert headroom(_ctx(MICRO)) is None  # CPU: no device peak
    assert headroom(_ctx(MICRO, H100)) is None  # CUDA, peak not measured
    # with accumulation, accumulation_for_speed says it (a larger micro-batch, no accumulation)
    ctx = _ctx(dict(MICRO, accumulation_steps=2), H100, {"kind": "accumulation", "factor": 2}, peak=6 * GIB)
    assert headroom(ctx) is None
    found = [f for f in diagnose(ctx.run, ctx.summary) if "micro" in f["title"].lower() or "accumulation" in f["id"]]
    assert [f["id"] for f in found] == ["accumulation_for_speed"]
    assert "train_micro_batch_size_per_gpu=16" in found[0]["recommendation"]


def test_the_engine_precision_sets_the_peak_dtype():
    # DeepSpeed's torch_autocast section: fp32 parameters, autocast only inside the engine
    autocast = {"kind": "deepspeed", "bf16": False, "fp16": False, "torch_autocast": True,
                "torch_autocast_dtype": "bfloat16"}
    model = {"kind": "model", "param_dtype": "float32", "autocast": None}
    assert engine_precision_of([model, autocast]) == "bf16-mixed"
    assert matmul_dtype([model, autocast], "cpu") == "bf16"
    assert matmul_dtype([model, dict(autocast, torch_autocast_dtype="float16")], "cpu") == "fp16"
    assert engine_precision_of([ENGINE]) == "bf16" and matmul_dtype([ENGINE], "cpu") == "bf16"
    fp32 = dict(autocast, torch_autocast=False)
    assert engine_precision_of([fp32]) is None and matmul_dtype([model, fp32], "cpu") == "fp32"
    assert engine_precision_of([model]) is None


def test_device_memory_on_cpu_is_the_ram_all_local_ranks_share():
    import psutil
    import torch

    from trainspeed.doctor.instrument.deepspeed import device_memory

    ram = device_memory(torch.device("cpu"), {"LOCAL_WORLD_SIZE": "2"})
    assert ram == {"device_memory": psutil.virtual_memory().total, "device_memory_of": "machine RAM",
                   "memory_shared_by": 2}
    assert device_memory(torch.device("cpu"), {})["memory_shared_by"] == 1


def test_the_trainers_own_engine_is_told_its_engine_keys_and_tune(tmp_path):
    """distributed.strategy=deepspeed: the engine records the same observation (with
    trainspeed_engine), and the advice names distributed.* keys and the config's tune, not a
    JSON edit and a doctor run of a script."""
    run = make_run(shares={"forward": 0.3, "backward": 0.6},
                   obs=[dict(ENGINE, offload_optimizer=False, trainspeed_engine=True, dp_world_size=2,
                             overlap_comm=False, zero_stage=2)])
    run.path = tmp_path
    (tmp_path / "config.yaml").write_text("recipe:\n  name: gpt\n")
    overlap = checks.zero2_overlap(ctx_of(run))
    assert overlap.recommendation.startswith("distributed.overlap_comm=true: overlap_comm reduces")
    # a gain only several processes show: the run again as launched, not a one-process tune
    assert overlap.verify_with == (f"trainspeed train {tmp_path / 'config.yaml'} run.name={tmp_path.name}-after "
                                   "(after the change: the backward share should drop)")
    run.events = [e for e in run.events if (e.get("data") or {}).get("kind") != "deepspeed"]
    run.events.append({"schema": 1, "type": "observation", "step": 0, "t_wall": 0.0,
                       "data": dict(ENGINE, offload_optimizer=False, trainspeed_engine=True)})
    beyond = checks.zero_beyond_memory(ctx_of(run))
    assert "distributed.zero_stage=0: one process has nothing to partition" in beyond.recommendation
    assert "the DeepSpeed config the engine built (distributed.* in config.yaml)" in beyond.evidence
    assert beyond.verify_with == f"trainspeed tune {tmp_path / 'config.yaml'} --knobs zero_stage"


def test_an_engine_runs_doctor_command_reruns_its_config_under_a_new_name(tmp_path):
    run = make_run()
    run.path = tmp_path / "gpt-1"
    run.path.mkdir()
    (run.path / "config.yaml").write_text("recipe:\n  name: gpt\n")
    ctx = ctx_of(run)
    assert ctx.doctor_command() == f"trainspeed train {run.path / 'config.yaml'} run.name=gpt-1-after"
    ctx.summary["ranks"] = [{"rank": 0}, {"rank": 1}]
    assert ctx.doctor_command(steps=50) == (f"torchrun --nproc_per_node 2 -m trainspeed train "
                                            f"{run.path / 'config.yaml'} run.name=gpt-1-after run.max_steps=50")


def test_a_script_doctored_on_several_ranks_is_doctored_again_under_torchrun(tmp_path):
    """The doctor's verify commands relaunch a script the way it ran: under torchrun with as
    many ranks, into a new directory all ranks agree on (--out is required there)."""
    run = make_run()
    run.path = tmp_path / "doc"
    run.config = {"command": ["python", "train_bert_ds.py", "--batch_size", "8"]}
    ctx = ctx_of(run)
    assert ctx.doctor_command() == "trainspeed doctor -- python train_bert_ds.py --batch_size 8"
    ctx.summary["ranks"] = [{"rank": 0}, {"rank": 1}]
    assert ctx.doctor_command(steps=40) == (f"torchrun --nproc_per_node 2 -m trainspeed doctor --steps 40 "
                                            f"--out {tmp_path / 'doc'}-after -- python train_bert_ds.py "
                                            f"--batch_size 8")
    assert ctx.tune_command("padding") == f"{ctx.doctor_command()} (after the change)"
