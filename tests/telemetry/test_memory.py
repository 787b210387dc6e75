from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest
import torch

from trainspeed.telemetry import memory
from trainspeed.telemetry.memory import cuda_memory, process_rss, reset_cuda_peak

pytestmark = pytest.mark.timeout(60)


def test_process_rss_main_matches_psutil():
    main, children = process_rss(include_children=False)
    expected = psutil.Process(os.getpid()).memory_info().rss
    assert children == 0
    assert abs(main - expected) < 64 * 2**20  # same process, read moments apart


def test_process_rss_counts_children():
    # A plain child process (like a DataLoader worker) holding 64 MiB of touched memory.
    code = "b = bytearray(64 * 2**20); b[::4096] = b'\\x01' * len(b[::4096]); print('ready', flush=True); input()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        _, children = process_rss(include_children=True)
        assert children >= 64 * 2**20
        _, none = process_rss(include_children=False)
        assert none == 0
    finally:
        child.stdin.close()
        child.wait(10)


class _FakeChild:
    def memory_info(self):
        raise psutil.NoSuchProcess(pid=123)


class _LiveChild:
    def memory_info(self):
        return type("M", (), {"rss": 1000})()


class _FakeProc:
    def memory_info(self):
        return type("M", (), {"rss": 5000})()

    def children(self, recursive=True):
        return [_FakeChild(), _LiveChild(), _LiveChild()]


def test_process_rss_tolerates_vanished_worker(monkeypatch):
    monkeypatch.setattr(memory, "_process", lambda: _FakeProc())
    assert process_rss() == (5000, 2000)


class FakeCuda:
    """Stands in for torch.cuda: only the host-side allocator counters memory.py reads."""

    def __init__(self, available=True):
        self.available = available
        self.reset_calls = []
        self.current = 1

    def is_available(self):
        return self.available

    def current_device(self):
        return self.current

    def memory_stats(self, index):
        return {"num_alloc_retries": 3 + index}

    def max_memory_allocated(self, index):
        return 1000 * (index + 1)

    def max_memory_reserved(self, index):
        return 2000 * (index + 1)

    def get_device_properties(self, index):
        return type("P", (), {"total_memory": 80 * 2**30})()

    def reset_peak_memory_stats(self, index):
        self.reset_calls.append(index)


def test_cuda_memory_reads_allocator_counters(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(memory, "_cuda_api", lambda: fake)
    assert cuda_memory("cuda:0") == {
        "cuda_alloc_peak": 1000,
        "cuda_reserved_peak": 2000,
        "cuda_alloc_retries": 3,
        "cuda_total": 80 * 2**30,
    }
    # device=None and bare "cuda" mean the current device (index 1 here).
    assert cuda_memory()["cuda_alloc_peak"] == 2000
    assert cuda_memory(torch.device("cuda"))["cuda_alloc_retries"] == 4
    assert cuda_memory(0)["cuda_reserved_peak"] == 2000
    assert cuda_memory("cpu") == {}


def test_cuda_memory_empty_without_cuda(monkeypatch):
    monkeypatch.setattr(memory, "_cuda_api", lambda: FakeCuda(available=False))
    assert cuda_memory() == {}
    reset_cuda_peak()  # no error


def test_reset_cuda_peak(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(memory, "_cuda_api", lambda: fake)
    reset_cuda_peak("cuda:0")
    reset_cuda_peak()
    reset_cuda_peak("cpu")
    assert fake.reset_calls == [0, 1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the real CPU-only path")
def test_cuda_memory_real_cpu_only_build():
    assert cuda_memory() == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_memory_real_gpu():
    reset_cuda_peak()
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    mem = cuda_memory("cuda")
    assert mem["cuda_alloc_peak"] >= 256 * 2**20
    assert mem["cuda_reserved_peak"] >= mem["cuda_alloc_peak"]
    assert mem["cuda_total"] > mem["cuda_reserved_peak"]
    del x
