from __future__ import annotations

import contextlib
from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch

import trainspeed.engine.data.prefetch as prefetch_mod
from trainspeed.engine.data import DevicePrefetcher, PadCollate, batch_stats, move_to_device

pytestmark = pytest.mark.timeout(60)

Pair = namedtuple("Pair", "x y")


@dataclass
class Holder:
    a: torch.Tensor
    note: str


def test_move_to_device_recurses_and_keeps_structure():
    batch = {"ids": torch.ones(2), "nested": [torch.zeros(1), (torch.ones(3), 5)], "p": Pair(torch.ones(1), "s"),
             "h": Holder(a=torch.ones(2), note="n")}
    out = move_to_device(batch, "meta")
    assert out["ids"].device.type == "meta"
    assert out["nested"][0].device.type == "meta" and isinstance(out["nested"][1], tuple)
    assert out["nested"][1][0].device.type == "meta" and out["nested"][1][1] == 5
    assert isinstance(out["p"], Pair) and out["p"].x.device.type == "meta" and out["p"].y == "s"
    assert isinstance(out["h"], Holder) and out["h"].a.device.type == "meta" and out["h"].note == "n"
    assert batch["ids"].device.type == "cpu"  # input untouched
    t = torch.ones(2)
    assert move_to_device(t, "cpu") is t


def test_cpu_pass_through_keeps_order_and_stats():
    seqs = [[torch.arange(1, n + 1)] for n in (3, 1, 2, 5)]
    batches = [PadCollate()(s) for s in seqs]
    pf = DevicePrefetcher(batches, "cpu", stats_fn=batch_stats)
    assert not pf.uses_stream and len(pf) == 4
    seen = []
    for b in pf:
        seen.append(b[0].shape[1])
        assert pf.last_stats.tokens == b[2].sum().item()
    assert seen == [3, 1, 2, 5]
    assert list(DevicePrefetcher(iter(range(3)), "cpu", enabled=False)) == [0, 1, 2]
    # iterating twice works (a new epoch)
    assert [b[0].shape[1] for b in pf] == [3, 1, 2, 5]


class FakeBackend:
    """Records the stream calls DevicePrefetcher makes, in order."""

    def __init__(self, log):
        self.log = log
        self.n_streams = 0

    def new_stream(self, device):
        self.n_streams += 1
        self.log.append("new_stream")
        return "copy"

    def current_stream(self, device):
        return "compute"

    @contextlib.contextmanager
    def stream_context(self, stream):
        self.log.append(f"enter:{stream}")
        yield
        self.log.append(f"exit:{stream}")

    def wait_stream(self, waiter, stream):
        self.log.append(f"wait:{waiter}<-{stream}")

    def record_stream(self, tensor, stream):
        self.log.append(f"record:{int(tensor.flatten()[0])}:{stream}")


def test_fake_stream_path_waits_records_and_overlaps(monkeypatch):
    log: list[str] = []
    real_move = prefetch_mod.move_to_device

    def logged_move(batch, device, non_blocking):
        log.append(f"copy:{int(batch['x'].flatten()[0])}:nb={non_blocking}")
        return real_move(batch, device, non_blocking)

    monkeypatch.setattr(prefetch_mod, "move_to_device", logged_move)

    def source():
        for i in range(3):
            log.append(f"load:{i}")
            yield {"x": torch.full((2,), i), "y": torch.full((1,), 10 + i), "tag": "t"}

    backend = FakeBackend(log)
    pf = DevicePrefetcher(source(), "cpu", backend=backend, stats_fn=lambda b: int(b["x"][0]))
    assert pf.uses_stream
    out = []
    for b in pf:
        log.append(f"train:{int(b['x'][0])}")
        assert pf.last_stats == int(b["x"][0])
        out.append(b)
    assert [int(b["x"][0]) for b in out] == [0, 1, 2] and out[0]["tag"] == "t"
    assert backend.n_streams == 1
    assert log == [
        "new_stream",
        "load:0", "enter:copy", "copy:0:nb=True", "exit:copy",
        "wait:compute<-copy", "record:0:compute", "record:10:compute",
        # the next batch's copy is issued before this batch trains: they overlap
        "load:1", "enter:copy", "copy:1:nb=True", "exit:copy",
        "train:0",
        "wait:compute<-copy", "record:1:compute", "record:11:compute",
        "load:2", "enter:copy", "copy:2:nb=True", "exit:copy",
        "train:1",
        "wait:compute<-copy", "record:2:compute", "record:12:compute",
        "train:2",
    ]


def test_disabled_on_cuda_device_string_does_not_touch_cuda():
    pf = DevicePrefetcher([1, 2], "cuda", enabled=False)
    assert not pf.uses_stream


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_prefetch_values_and_order():
    batches = [{"x": torch.full((256, 256), float(i)).pin_memory()} for i in range(6)]
    pf = DevicePrefetcher(batches, "cuda")
    assert pf.uses_stream
    got = []
    for b in pf:
        assert b["x"].is_cuda
        got.append(float((b["x"] * 2).mean()))  # compute on the current stream reads the copy
    assert got == [2.0 * i for i in range(6)]
