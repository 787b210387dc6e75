from __future__ import annotations

import json
import types

import pytest
import torch

from trainspeed.telemetry import env as env_mod
from trainspeed.telemetry.env import CPU_FLAGS, collect_env, cpu_flags, cpu_model, cpu_quota

pytestmark = pytest.mark.timeout(60)

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme avx2 avx512f avx512_bf16 amx_bf16 amx_tile avx512_fp16
bugs\t\t: spectre_v1

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu
"""

OLD_CPUINFO = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU E5-2686 v4\nflags\t\t: fpu sse avx avx2 fma\n"


def test_cpu_flags_from_cpuinfo(tmp_path):
    p = tmp_path / "cpuinfo"
    p.write_text(CPUINFO)
    assert cpu_flags(p) == {"avx512_bf16": True, "amx_bf16": True, "amx_tile": True, "avx512f": True, "avx2": True}
    assert cpu_model(p) == "Intel(R) Xeon(R) Platinum 8480+"
    p.write_text(OLD_CPUINFO)
    assert cpu_flags(p) == {"avx512_bf16": False, "amx_bf16": False, "amx_tile": False, "avx512f": False, "avx2": True}


def test_cpu_flags_absent_file(tmp_path):
    assert cpu_flags(tmp_path / "missing") == {flag: False for flag in CPU_FLAGS}
    assert isinstance(cpu_model(tmp_path / "missing"), str)


def test_cpu_flags_does_not_match_substrings(tmp_path):
    p = tmp_path / "cpuinfo"
    p.write_text("flags\t: avx512_bf16x amx_bf16_extra avx2\n")  # made-up longer names
    assert cpu_flags(p)["avx512_bf16"] is False and cpu_flags(p)["amx_bf16"] is False


def test_cpu_quota_cgroup_v2_and_v1(tmp_path):
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert cpu_quota(tmp_path) == pytest.approx(2.5)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(v1) == pytest.approx(4.0)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(v1) is None
    assert cpu_quota(tmp_path / "nothing") is None


def test_collect_env_shape_and_json():
    env = collect_env()
    for key in ("schema", "python", "platform", "torch", "cuda", "cudnn", "devices", "cpu", "nvml", "trainspeed", "hostname"):
        assert key in env, key
    assert env["schema"] == 1
    assert env["torch"] == torch.__version__
    assert env["cuda"] == torch.version.cuda
    cpu = env["cpu"]
    assert set(cpu["flags"]) == set(CPU_FLAGS)
    assert cpu["torch_threads"] == torch.get_num_threads()
    assert cpu["logical_cores"] >= 1
    assert cpu["capability"] == torch.backends.cpu.get_cpu_capability()
    assert cpu["bf16_fast"] == (cpu["flags"]["avx512_bf16"] or cpu["flags"]["amx_bf16"])
    assert isinstance(env["nvml"], bool)
    assert "peak_flops" not in env  # no precision given -> no peak chosen
    json.dumps(env, allow_nan=False)


@pytest.mark.parametrize(
    "flags, fast",
    [({"avx512_bf16": True}, True), ({"amx_bf16": True}, True), ({"amx_tile": True, "avx512f": True, "avx2": True}, False), ({}, False)],
)
def test_bf16_fast_needs_bf16_units(monkeypatch, flags, fast):
    monkeypatch.setattr(env_mod, "cpu_flags", lambda: {f: flags.get(f, False) for f in CPU_FLAGS})
    assert collect_env()["cpu"]["bf16_fast"] is fast


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only path")
def test_collect_env_cpu_peak(monkeypatch):
    env = collect_env(precision="bf16-mixed", measure_peak=False)
    assert env["devices"] == [] and env["peak_flops"] is None
    from trainspeed.telemetry import peaks

    fake = peaks.PeakFlops(name="cpu (fake)", dtype="bf16", flops=5e11, source="measured")
    monkeypatch.setattr(peaks, "peak_for", lambda dev, dtype, measure_if_unknown=True: fake)
    env = collect_env(precision="bf16-mixed", measure_peak=True)
    assert env["peak_flops"] == {"name": "cpu (fake)", "dtype": "bf16", "flops": 5e11, "source": "measured"}


def test_devices_with_fake_cuda(monkeypatch):
    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=80 * 2**30, major=9, minor=0, multi_processor_count=132)
    fake_torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1, get_device_properties=lambda i: props)
    )
    devices = env_mod._devices(fake_torch)
    assert devices == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total": 80 * 2**30,
            "capability": "9.0",
            "multiprocessors": 132,
            "peak_flops": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12, "fp64": 67e12},
        }
    ]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_collect_env_real_gpu():
    env = collect_env(precision="bf16-mixed")
    assert env["devices"] and env["devices"][0]["name"] == torch.cuda.get_device_name(0)
    assert env["devices"][0]["memory_total"] > 2**30
