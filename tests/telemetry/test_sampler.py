from __future__ import annotations

import sys
import threading
import types

import numpy as np
import pytest

from trainspeed.errors import ConfigError
from trainspeed.telemetry import sampler as sampler_mod
from trainspeed.telemetry.sampler import GPU_FIELDS, NvmlReader, SystemSampler, open_nvml

pytestmark = pytest.mark.timeout(30)


class FakeGpu:
    def __init__(self):
        self.closed = False
        self.i = 0

    def read(self):
        self.i += 1
        return {"gpu_util": 10.0 * self.i, "gpu_mem_used": 1000.0 * self.i, "gpu_power_w": 100.0, "gpu_sm_clock_mhz": 1980.0}

    def close(self):
        self.closed = True


def _scripted(s: SystemSampler, rows):
    """Replace the host read with scripted rows (the GPU part still comes from the reader)."""
    it = iter(rows)

    def read():
        row = dict(next(it))
        if s._gpu is not None:
            row.update(s._gpu.read())
        return row

    s._read = read


def test_ring_keeps_last_capacity_rows_in_time_order():
    s = SystemSampler(capacity=3)
    _scripted(s, [{"t": float(i), "cpu_process": 10.0 * i, "cpu_system": 5.0, "rss": 100.0 * i, "children_rss": 0.0} for i in range(1, 6)])
    for _ in range(5):
        s.sample_once()
    data = s.samples()
    np.testing.assert_array_equal(data["t"], [3.0, 4.0, 5.0])
    np.testing.assert_array_equal(data["rss"], [300.0, 400.0, 500.0])
    assert not any(f in data for f in GPU_FIELDS)  # no GPU reader -> no GPU columns
    assert s.latest() == {"t": 5.0, "cpu_process": 50.0, "cpu_system": 5.0, "rss": 500, "children_rss": 0}
    summ = s.summary()
    assert summ["samples"] == 3
    assert summ["cpu_process_mean"] == pytest.approx(40.0) and summ["cpu_process_max"] == 50.0
    assert summ["rss_mean"] == 400 and summ["rss_max"] == 500 and isinstance(summ["rss_max"], int)
    assert "gpu_util_mean" not in summ


def test_gpu_fields_from_reader():
    gpu = FakeGpu()
    s = SystemSampler(gpu_reader=gpu)
    _scripted(s, [{"t": 1.0, "cpu_process": 1.0, "cpu_system": 1.0, "rss": 1.0, "children_rss": 0.0}] * 2)
    s.sample_once()
    s.sample_once()
    assert s.has_gpu
    latest = s.latest()
    assert latest["gpu_util"] == 20.0 and latest["gpu_mem_used"] == 2000 and latest["gpu_power_w"] == 100.0
    summ = s.summary()
    assert summ["gpu_util_mean"] == pytest.approx(15.0) and summ["gpu_util_max"] == 20.0
    assert summ["gpu_mem_used_max"] == 2000
    np.testing.assert_array_equal(s.samples()["gpu_sm_clock_mhz"], [1980.0, 1980.0])
    s.stop()
    assert gpu.closed and not s.has_gpu


def test_empty_sampler():
    s = SystemSampler()
    assert s.latest() == {}
    assert s.summary() == {"samples": 0, "interval_s": 1.0}
    assert s.samples()["t"].size == 0


def test_read_errors_are_counted_not_raised():
    s = SystemSampler()

    def boom():
        raise OSError("proc vanished")

    s._read = boom
    s.sample_once()
    assert s.latest() == {} and s.summary()["sample_errors"] == 1


@pytest.mark.parametrize("kwargs", [{"interval_s": 0}, {"interval_s": -1.0}, {"capacity": 0}, {"capacity": 2.5}])
def test_invalid_settings(kwargs):
    with pytest.raises(ConfigError):
        SystemSampler(**kwargs)


def test_real_thread_samples_and_stops():
    s = SystemSampler(interval_s=0.02, capacity=8)
    got_two = threading.Event()
    real = s.sample_once

    def counting():
        real()
        if s._count >= 2:
            got_two.set()

    s.sample_once = counting
    s.start()
    assert s.running
    assert got_two.wait(10)
    s.stop()
    assert not s.running
    latest = s.latest()
    assert latest["rss"] > 10 * 2**20  # a Python process with numpy and torch loaded
    assert 0.0 <= latest["cpu_system"] <= 100.0
    assert latest["cpu_process"] >= 0.0
    n = s._count
    assert n >= 2
    s.sample_once = real
    assert s._count == n  # nothing samples after stop


def test_stop_is_prompt_with_long_interval():
    # A sleep-based loop would still be sleeping after stop()'s 5 s join guard.
    s = SystemSampler(interval_s=600.0).start()
    s.stop()
    assert not s.running
    assert s.summary()["samples"] == 0


def _fake_pynvml(power_supported=True, init_ok=True):
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM = 1
    m.calls = []

    def init():
        if not init_ok:
            raise RuntimeError("NVML Shared Library Not Found")
        m.calls.append("init")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")

    def by_uuid(uuid):
        raise RuntimeError("not found")

    m.nvmlDeviceGetHandleByUUID = by_uuid
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=40)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=3 * 2**30, total=80 * 2**30)

    def power(h):
        if not power_supported:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 312_500  # milliwatts

    m.nvmlDeviceGetPowerUsage = power
    m.nvmlDeviceGetClockInfo = lambda h, kind: 1755 if kind == 1 else 0
    return m


def test_nvml_reader_converts_units():
    fake = _fake_pynvml()
    r = NvmlReader(fake, "h")
    assert r.read() == {"gpu_util": 87.0, "gpu_mem_used": float(3 * 2**30), "gpu_power_w": 312.5, "gpu_sm_clock_mhz": 1755.0}
    r.close()
    assert fake.calls == ["shutdown"]


def test_nvml_reader_leaves_out_unsupported_counters():
    r = NvmlReader(_fake_pynvml(power_supported=False), "h")
    assert "gpu_power_w" not in r.read() and r.read()["gpu_util"] == 87.0


def test_open_nvml_with_fake_module(monkeypatch):
    fake = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setattr(sampler_mod, "_nvml_index", lambda i: (None, [3, 5][i]))
    reader = open_nvml(1)
    assert isinstance(reader, NvmlReader) and reader._handle == ("handle", 5)
    assert fake.calls == ["init"]


def test_nvml_index_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert sampler_mod._nvml_index(1)[1] == 5
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert sampler_mod._nvml_index(1)[1] == 1


def test_open_nvml_absent_or_broken(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    assert open_nvml(0) is None
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_ok=False))
    assert open_nvml(0) is None


def test_sampler_without_nvml_has_no_gpu_fields(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    s = SystemSampler(interval_s=600.0, gpu_index=0).start()
    s.sample_once()
    s.stop()
    assert not any(k.startswith("gpu_") for k in s.latest())
    assert s.latest()["rss"] > 0


@pytest.mark.timeout(120)
def test_a_run_root_makes_the_sibling_processes_part_of_the_run(tmp_path):
    """A training process the doctor follows (doctor/spawned.py) counts its sibling trainers as
    the run, not as other processes' load: its sampler's tree is the run root's."""
    import json
    import os
    import subprocess

    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    code = ("from trainspeed.telemetry.sampler import SystemSampler\n"
            "s = SystemSampler(interval_s=10).start()\nprint([k.pid for k in s._children()])\ns.stop()\n")
    try:
        def tree(env: dict[str, str]) -> list[int]:
            out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                                 text=True, timeout=60, check=True).stdout
            return json.loads(out.strip().splitlines()[-1])

        assert sibling.pid in tree({sampler_mod.RUN_ROOT_PID_ENV: str(os.getpid())})
        assert sibling.pid not in tree({sampler_mod.RUN_ROOT_PID_ENV: ""})
    finally:
        sibling.kill()
        sibling.wait()
