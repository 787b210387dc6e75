"""CUDA paths of issue 29, run with `pytest -m gpu` when a GPU is lent (skipped without one):
fp16 with a GradScaler in the Trainer, a real out-of-memory retried at a smaller micro-batch,
the doctor on an unchanged CUDA script (its figures from the measured steps: GPU busy,
memory, the fp32 share at stake with its basis), and the engine's own run getting the same
fp32 check. Each is sized to take seconds on an H100."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[1]
GPU_SCRIPTS = ROOT / "benchmarks" / "scripts" / "gpu"


def _cfg(tmp_path, name, **over):
    cfg = {"run": {"out_dir": str(tmp_path), "name": name, "max_steps": 12, "seed": 0, "device": "cuda"},
           "data": {"batch_size": 64, "shuffle": False},
           "logging": {"every": 4, "warmup_steps": 1, "progress": False},
           "checkpoint": {"save_final": False}, "eval": {"at_end": False}}
    for key, value in over.items():
        cfg.setdefault(key, {}).update(value)
    return cfg


def mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def _data(n=1024, width=256):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, width, generator=g)
    return TensorDataset(x, x[:, :1] * 2.0)


def test_trainer_fp16_with_grad_scaler_trains(tmp_path):
    from trainspeed.engine.trainer import Trainer
    from trainspeed.telemetry import read_run

    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1))
    cfg = _cfg(tmp_path, "fp16", precision={"mode": "fp16-mixed"}, run={"max_steps": 40},
               optim={"name": "adamw", "lr": 1e-3})
    trainer = Trainer(model, mse, _data(), config=cfg)
    summary = trainer.fit()
    assert trainer.precision.scaler is not None and trainer.precision.scaler.is_enabled()
    assert summary["precision"] == "fp16-mixed"
    assert summary["loss"]["last"] < summary["loss"]["first"]
    mem = read_run(tmp_path / "fp16").steps[-1]["mem"]
    assert mem.get("cuda_alloc_peak", 0) > 0  # the CUDA memory figures of each record


def test_real_out_of_memory_is_retried_at_a_smaller_micro_batch(tmp_path):
    """The device's memory is capped (set_per_process_memory_fraction) so that the batch's
    activations do not fit: the allocator raises a real torch.OutOfMemoryError, and
    batch.auto_microbatch splits the step until it fits."""
    from trainspeed.engine.trainer import Trainer
    from trainspeed.telemetry import read_run

    total = torch.cuda.get_device_properties(0).total_memory
    width = 4096
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.GELU())], nn.Linear(width, 1))
    state = 4 * sum(p.numel() for p in model.parameters()) * 4  # params, grads, Adam's two moments
    batch = 16384  # 256 MiB per fp32 activation, ~2 GiB for the forward's saved tensors
    budget = state + 1.0 * 2**30
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(0.95, budget / total), 0)
    try:
        cfg = _cfg(tmp_path, "oom", data={"batch_size": batch}, batch={"auto_microbatch": True},
                   run={"max_steps": 4}, optim={"name": "adamw", "lr": 1e-4})
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch * 2, width, generator=g)
        Trainer(model, mse, TensorDataset(x, x[:, :1]), config=cfg).fit()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
    events = [e["data"] for e in read_run(tmp_path / "oom").events_of("auto_microbatch")]
    assert events and events[-1]["micro_batch"] < batch and "out of memory" in events[0]["error"].lower()
    assert len(read_run(tmp_path / "oom").steps) == 4


def test_doctor_on_a_cuda_script_names_fp32_with_figures_of_the_measured_steps(tmp_path, monkeypatch):
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    monkeypatch.chdir(tmp_path)
    result = run_doctor(DoctorConfig(command=["python", str(GPU_SCRIPTS / "fp32_mlp.py"), "--steps", "100000"],
                                     steps=40, out=tmp_path / "run", system_sampler=True))
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    summary, findings = report["summary"], report["findings"]
    first = findings[0]
    assert first["id"] == "fp32_on_tensor_cores", [f["id"] for f in findings]
    # derived, with its basis: the matmuls' share x (1 - fp32/bf16 peak), never a fixed 40 %
    assert "matmuls take at least" in first["basis"] and first["impact"] != pytest.approx(0.4, abs=0.005)
    assert summary["memory"]["cuda_alloc_peak"] > 0 and summary["mfu"]["valid"]
    busy = summary.get("gpu_busy")
    if busy is not None and busy.get("valid"):  # NVML present (nvidia-ml-py)
        assert busy["value"] >= summary["mfu"]["value"] - 0.02
        assert not any(f["id"] == "low_gpu_utilization" for f in findings)
    assert sum(f["impact"] for f in findings if not f.get("overlaps")) <= 1.0 + 1e-9
    assert result.findings[0]["id"] == "fp32_on_tensor_cores"


def test_engine_fp32_run_on_cuda_gets_the_fp32_finding(tmp_path):
    """`trainspeed train gpt` in fp32 on a GPU: its report names fp32 with the config key."""
    import subprocess

    cmd = [sys.executable, "-m", "trainspeed", "train", "gpt", "--variant=naive", "--no-report",
           "run.device=cuda", "run.max_steps=30", f"run.out_dir={tmp_path}", "run.name=g",
           "recipe.options.size=small", "data.batch_size=32", "logging.progress=false", "eval.at_end=false"]
    subprocess.run(cmd, check=True, timeout=240)
    findings = json.loads((tmp_path / "g" / "report.json").read_text())["findings"]
    fp32 = next(f for f in findings if f["id"] == "fp32_on_tensor_cores")
    assert "precision.mode=bf16-mixed" in fp32["recommendation"] and fp32["basis"]
    assert not any("your own code" in (f.get("evidence") or "") for f in findings)


COMPILED_CUDA_SCRIPT = '''import torch
model = torch.compile(torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                          torch.nn.Linear(4096, 1024)).cuda())
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
x = torch.randn(256, 1024, device="cuda")
for step in range(100000):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
'''


def test_doctor_counts_a_compiled_cuda_models_flops(tmp_path, monkeypatch):
    """A compiled model's one counted step runs eagerly under the FLOP counter (with the memory
    to spare): its MFU is measured, as the eager model's is (llama2.c --compile=True on the CPU
    read "MFU not measured")."""
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    monkeypatch.chdir(tmp_path)
    (tmp_path / "compiled.py").write_text(COMPILED_CUDA_SCRIPT)
    result = run_doctor(DoctorConfig(command=["python", "compiled.py"], steps=30, out=tmp_path / "run",
                                     system_sampler=False))
    assert result.steps == 30, result.traceback
    mfu = result.summary["mfu"]
    assert mfu["valid"] and 0 < mfu["value"] <= 1, mfu
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    flops = [e["data"]["flops_per_step"] for e in events if e["type"] == "flops"]
    assert flops == [pytest.approx(3 * 2 * 256 * 2 * 1024 * 4096 - 2 * 256 * 1024 * 4096, rel=0.01)], flops
