from __future__ import annotations

import pytest
import torch

from trainspeed.errors import ConfigError
from trainspeed.telemetry import peaks
from trainspeed.telemetry.peaks import PEAK_TABLE, dtype_for_precision, lookup_peak, measure_matmul_peak, peak_for

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "device_name, dtype, name, tflops",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", "NVIDIA H100 SXM", 989.4),
        ("NVIDIA H100 80GB HBM3", "tf32", "NVIDIA H100 SXM", 494.7),
        ("NVIDIA H100 PCIe", "bf16", "NVIDIA H100 PCIe", 756.5),
        ("NVIDIA H100 NVL", "fp16", "NVIDIA H100 NVL", 835.5),
        ("NVIDIA H200", "bf16", "NVIDIA H200 SXM", 989.4),
        ("NVIDIA H200 NVL", "fp32", "NVIDIA H200 NVL", 60),
        ("NVIDIA A100-SXM4-80GB", "bf16", "NVIDIA A100 SXM", 312),
        ("NVIDIA A100-SXM4-40GB", "fp32", "NVIDIA A100 SXM", 19.5),
        ("NVIDIA A100-PCIE-40GB", "tf32", "NVIDIA A100 PCIe", 156),
        ("NVIDIA A100 80GB PCIe", "fp16", "NVIDIA A100 PCIe", 312),
        ("NVIDIA L4", "bf16", "NVIDIA L4", 121),
        ("NVIDIA L40S", "bf16", "NVIDIA L40S", 362.05),
        ("NVIDIA A10G", "fp16", "NVIDIA A10G", 70),
        ("NVIDIA A10", "bf16", "NVIDIA A10", 125),
        ("NVIDIA GeForce RTX 3090", "bf16", "NVIDIA GeForce RTX 3090", 71),
        ("NVIDIA GeForce RTX 4090", "fp32", "NVIDIA GeForce RTX 4090", 82.6),
        ("Tesla V100-SXM2-16GB", "fp16", "NVIDIA V100 SXM2", 125),
        ("Tesla V100-PCIE-32GB", "fp32", "NVIDIA V100 PCIe", 14),
        ("Tesla V100S-PCIE-32GB", "fp16", "NVIDIA V100S PCIe", 130),
        ("Tesla T4", "fp16", "NVIDIA T4", 65),
        ("tesla t4", "tf32", "NVIDIA T4", 8.1),  # case-insensitive; no TF32 before Ampere -> fp32 peak
    ],
)
def test_lookup_peak_table(device_name, dtype, name, tflops):
    p = lookup_peak(device_name, dtype)
    assert p is not None
    assert p.name == name and p.dtype == dtype and p.source == "table"
    assert p.flops == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize("device_name", ["NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 4090 D", "NVIDIA B200", "", "cpu"])
def test_lookup_peak_unknown(device_name):
    assert lookup_peak(device_name, "bf16") is None


def test_lookup_peak_no_native_bf16():
    assert lookup_peak("Tesla V100-SXM2-16GB", "bf16") is None
    assert lookup_peak("Tesla T4", "bf16") is None


def test_table_is_dense_and_ordered():
    for row in PEAK_TABLE:
        # Tensor peaks are >= fp32 peaks, and no row carries a sparse (2x) number by mistake:
        # dense bf16 is never more than 16x fp32 on these parts.
        assert row.tf32 >= row.fp32
        if row.bf16 is not None:
            assert row.fp32 <= row.bf16 <= 16 * row.fp32
            assert row.bf16 == row.fp16


def test_lookup_peak_rejects_unknown_dtype():
    with pytest.raises(ConfigError, match="fp8"):
        lookup_peak("NVIDIA H100", "fp8")


@pytest.mark.parametrize(
    "precision, dtype", [("fp32", "fp32"), ("tf32", "tf32"), ("bf16-mixed", "bf16"), ("fp16-mixed", "fp16"), ("BF16-MIXED", "bf16")]
)
def test_dtype_for_precision(precision, dtype):
    assert dtype_for_precision(precision) == dtype


def test_dtype_for_precision_unknown():
    with pytest.raises(ConfigError, match="int4"):
        dtype_for_precision("int4")


def test_measure_matmul_peak_cpu_uses_two_n_cubed(monkeypatch):
    # Fake clock: every timed matmul appears to take exactly 0.25 s -> 2*n^3 / 0.25 FLOP/s.
    ticks = iter(i * 0.25 for i in range(100))
    monkeypatch.setattr(peaks.time, "perf_counter", lambda: next(ticks))
    p = measure_matmul_peak("cpu", torch.float32, n=64, repeats=3)
    assert p.source == "measured" and p.dtype == "fp32"
    assert p.flops == pytest.approx(2 * 64**3 / 0.25)


def test_a_cpu_matmul_that_did_not_get_its_cores_is_not_quiet(monkeypatch):
    # Beside 4 busy processes on 2 cores, 2 threads got ~0.7 cores (78 GFLOP/s against ~200):
    # CPU time over wall time of the fastest repeat tells the two apart.
    monkeypatch.setattr(peaks, "_cpu_threads", lambda: 2)
    monkeypatch.setattr("trainspeed.telemetry.loader_facts.available_cores", lambda: 2)
    for cpu_per_wall, quiet in ((0.7, False), (1.26, False), (1.6, True), (2.1, True)):
        wall = iter(i * 0.25 for i in range(100))
        cpu = iter(i * 0.25 * cpu_per_wall for i in range(100))
        monkeypatch.setattr(peaks.time, "perf_counter", lambda: next(wall))
        monkeypatch.setattr(peaks.time, "process_time", lambda: next(cpu))
        p = measure_matmul_peak("cpu", torch.float32, n=32, repeats=3)
        assert p.cores_used == pytest.approx(cpu_per_wall)
        assert peaks.timed_quietly(p) is quiet
    # one usable core (a container's cpuset): one core's worth is quiet even with 2 threads
    monkeypatch.setattr("trainspeed.telemetry.loader_facts.available_cores", lambda: 1)
    assert peaks.timed_quietly(peaks.PeakFlops(name="cpu", dtype="fp32", flops=1e9, source="measured", cores_used=0.95))
    # a GPU timing carries no CPU share and is taken as quiet
    assert peaks.timed_quietly(peaks.PeakFlops(name="gpu", dtype="bf16", flops=1e12, source="measured"))


def test_measure_matmul_peak_stops_at_budget(monkeypatch):
    # Each timed matmul "takes" 1 s: with a 2.5 s budget only 3 of 10 repeats run.
    t = iter(float(i) for i in range(100))
    calls = []
    monkeypatch.setattr(peaks.time, "perf_counter", lambda: calls.append(1) or next(t))
    p = measure_matmul_peak("cpu", torch.float32, n=8, repeats=10, budget_s=2.5)
    assert len(calls) == 6  # 3 repeats x (start, stop)
    assert p.flops == pytest.approx(2 * 8**3 / 1.0)


def test_measure_matmul_peak_real_cpu_is_plausible():
    p = measure_matmul_peak("cpu", torch.float32, n=128, repeats=2)
    assert 1e7 < p.flops < 1e14  # somewhere between a very slow and an impossible CPU
    assert p.name.startswith("cpu")


def test_peak_for_cpu_measures_and_caches(monkeypatch):
    calls = []

    def fake(device, dtype, n=1024, repeats=5, budget_s=2.0):
        calls.append((str(device), dtype))
        return peaks.PeakFlops(name="cpu (fake)", dtype="fp32", flops=1e11, source="measured")

    peaks._measured.cache_clear()
    monkeypatch.setattr(peaks, "measure_matmul_peak", fake)
    p1 = peak_for("cpu", "tf32")
    p2 = peak_for("cpu", "tf32")
    assert p1 == p2 and p1.flops == 1e11 and p1.dtype == "tf32"
    assert calls == [("cpu", torch.float32)]
    assert peak_for("cpu", "fp32", measure_if_unknown=False) is None
    peaks._measured.cache_clear()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_peak_for_cuda_known_or_measured():
    p = peak_for("cuda", "bf16")
    assert p is not None and p.flops > 1e12
    m = measure_matmul_peak("cuda", torch.bfloat16, n=2048, repeats=3)
    if p.source == "table":
        assert m.flops < 1.05 * p.flops  # a measured matmul never beats the datasheet
