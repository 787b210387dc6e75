from __future__ import annotations

import json

import pytest

from trainspeed.cli.env import advice, usable_cores
from trainspeed.cli.main import main

pytestmark = pytest.mark.timeout(60)


def _env(**over):
    env = {
        "schema": 1,
        "torch": "2.13.0+cpu",
        "devices": [],
        "cpu": {
            "model": "x",
            "physical_cores": 8,
            "logical_cores": 16,
            "available_cores": 16,
            "quota": None,
            "torch_threads": 8,
            "capability": "AVX2",
            "flags": {"avx512_bf16": False, "amx_bf16": False, "amx_tile": False, "avx512f": False, "avx2": True},
            "bf16_fast": False,
        },
        "nvml": False,
    }
    for key, value in over.items():
        if key == "cpu":
            env["cpu"] = {**env["cpu"], **value}
        else:
            env[key] = value
    return env


def _text(env) -> dict[str, str]:
    return dict(advice(env))


def test_bf16_advice_depends_on_units():
    assert "slower than fp32" in _text(_env())["bf16 on CPU"]
    fast = _env(cpu={"bf16_fast": True, "flags": {"amx_bf16": True, "avx512_bf16": True}})
    assert "native bf16 units (amx_bf16 and avx512_bf16)" in _text(fast)["bf16 on CPU"]


def test_gpu_precision_by_capability():
    h100 = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0",
            "peak_flops": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12}}
    v100 = {"index": 1, "name": "Tesla V100-SXM2-16GB", "capability": "7.0", "peak_flops": {"fp32": None}}
    text = _text(_env(devices=[h100, v100], nvml=False))
    assert "bf16-mixed" in text["precision on GPU 0"] and "TF32" in text["precision on GPU 0"]
    assert "GradScaler" in text["precision on GPU 1"]
    assert "CUDA is available" in text["fused optimizer"]
    assert "bf16 989.4" in text["MFU peak GPU 0"]
    assert "not in the peak table" in text["MFU peak GPU 1"]
    assert "nvidia-ml-py" in text["GPU sampling"]


def test_fused_optimizer_advice_on_cpu():
    assert "also has fused Adam/AdamW/SGD on CPU" in _text(_env())["fused optimizer"]
    assert "need CUDA" in _text(_env(torch="2.3.1"))["fused optimizer"]


def test_worker_advice_uses_quota_and_affinity():
    assert usable_cores(_env()) == 16
    assert "up to 15" in _text(_env())["DataLoader workers"]
    quota = _env(cpu={"quota": 4.0})
    assert usable_cores(quota) == 4
    assert "4 usable cores (container CPU quota 4)" in _text(quota)["DataLoader workers"]
    assert "up to 3" in _text(quota)["DataLoader workers"]
    assert "oversubscribed" in _text(quota)["DataLoader workers"]  # 8 torch threads on 4 cores
    small = _env(cpu={"available_cores": 2, "torch_threads": 2})
    assert "num_workers=1" in _text(small)["DataLoader workers"]
    assert "oversubscribed" not in _text(small)["DataLoader workers"]


def test_mfu_peak_advice():
    assert "measured matmul" in _text(_env())["MFU peak"]
    env = _env(peak_flops={"name": "cpu (2 threads)", "dtype": "bf16", "flops": 8.7e11, "source": "measured"})
    assert _text(env)["MFU peak"] == ("MFU is reported against cpu (2 threads) bf16: 0.87 TFLOP/s "
                                      "(measured matmul on this machine).")


def test_cli_json(capsys):
    assert main(["env", "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["schema"] == 1 and "cpu" in env and "peak_flops" not in env


def test_cli_text(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "trainspeed env" in out and "What this means" in out and "bf16 on CPU" in out


def test_cli_under_slurm_names_the_job(capsys, monkeypatch):
    for key in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "81234")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("COLUMNS", "200")  # the row on one line, whatever the terminal
    assert main(["env", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["slurm"] == {"job_id": "81234", "restart": 1}
    assert main(["env"]) == 0
    assert "job 81234, restart 1 (trainspeed train saves and requeues on SIGUSR1" in capsys.readouterr().out
    monkeypatch.delenv("SLURM_JOB_ID")
    assert main(["env"]) == 0
    assert "slurm" not in capsys.readouterr().out


def test_cli_bad_precision(capsys):
    assert main(["env", "--precision", "int3"]) == 2
    assert "int3" in capsys.readouterr().err
