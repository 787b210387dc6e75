from __future__ import annotations

import threading
from collections import OrderedDict

import pytest
import torch

from trainspeed.engine.checkpoint.async_save import AsyncSaver, to_host
from trainspeed.errors import CheckpointError

pytestmark = pytest.mark.timeout(60)


def test_to_host_is_a_deep_snapshot():
    w = torch.ones(3, requires_grad=True)
    state = {"model": OrderedDict(w=w), "opt": {"state": {0: {"step": torch.tensor(2.0)}}, "groups": [{"lr": 0.1}]},
             "meta": ("x", 3)}
    snap = to_host(state)
    with torch.no_grad():
        w.mul_(5)
    state["opt"]["groups"][0]["lr"] = 0.9
    assert snap["model"]["w"].tolist() == [1.0, 1.0, 1.0]
    assert isinstance(snap["model"], OrderedDict) and not snap["model"]["w"].requires_grad
    assert snap["opt"]["groups"][0]["lr"] == 0.1 and snap["meta"] == ("x", 3)


def test_to_host_keeps_tied_weights_tied():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    snap = to_host(model.state_dict())
    assert snap["emb.weight"] is snap["head.weight"]
    view = torch.arange(10.0)
    snap2 = to_host({"a": view[2:5], "b": view[2:5], "c": view[3:6]})
    assert snap2["a"] is snap2["b"] and snap2["a"] is not snap2["c"]


def test_pool_reuses_host_buffers_between_saves():
    pool: dict = {}
    w = torch.arange(6.0).reshape(2, 3)
    first = to_host({"w": w, "step": torch.tensor(1)}, pool)
    ptr = first["w"].data_ptr()
    w.add_(10)
    second = to_host({"w": w, "step": torch.tensor(2)}, pool)
    assert second["w"].data_ptr() == ptr  # same buffer, overwritten in place
    assert second["w"].tolist() == [[10.0, 11.0, 12.0], [13.0, 14.0, 15.0]] and int(second["step"]) == 2
    third = to_host({"w": torch.zeros(4)}, pool)  # a new shape gets a new buffer
    assert third["w"].data_ptr() != ptr and third["w"].tolist() == [0.0] * 4


def test_one_write_at_a_time_and_bounded():
    saver = AsyncSaver()
    gate, gate2 = threading.Event(), threading.Event()
    order: list[str] = []

    def first(host, timing):
        gate.wait(10)
        order.append("first written")

    def second(host, timing):
        gate2.wait(10)
        order.append("second written")

    saver.submit({"x": torch.zeros(2)}, first)
    assert saver.busy
    threading.Timer(0.05, gate.set).start()
    timing = saver.submit({"x": torch.zeros(2)}, second)  # must wait for `first`
    order.append("second submitted")
    gate2.set()
    saver.wait()
    assert order == ["first written", "second submitted", "second written"]
    assert timing.waited_s > 0 and timing.blocking_s >= timing.copy_s
    assert not saver.busy and saver.last_write_s is not None


def test_writer_errors_surface_once():
    saver = AsyncSaver()

    def boom(host, timing):
        raise OSError("disk full")

    saver.submit({}, boom)
    with pytest.raises(CheckpointError, match="disk full"):
        saver.submit({}, lambda host, timing: None)
    saver.wait()  # reported once, then cleared


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_state_goes_to_pinned_host_memory():
    pool: dict = {}
    t = torch.randn(1024, device="cuda")
    snap = to_host({"t": t}, pool)
    assert snap["t"].device.type == "cpu" and snap["t"].is_pinned()
    assert torch.equal(snap["t"], t.cpu())
    snap2 = to_host({"t": t * 2}, pool)
    assert snap2["t"].data_ptr() == snap["t"].data_ptr()  # pinned buffer reused
