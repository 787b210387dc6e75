"""engine/distributed.py without launching processes: setup decisions, wrapping, state conversion."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainspeed.config import load_config
from trainspeed.engine.distributed import (
    Dist, OptimizerLoader, optim_state_by_index, optim_state_by_name, resolve_backend,
    setup_distributed, shard_units,
)
from trainspeed.errors import ConfigError


def _cfg(**dist):
    return load_config({"distributed": dist, "run": {"device": "cpu"}})


def test_backend_auto_and_nccl_without_cuda():
    assert resolve_backend("auto", torch.device("cpu")) == "gloo"
    assert resolve_backend("auto", torch.device("cuda", 0)) == "nccl"
    with pytest.raises(ConfigError, match="distributed.backend=nccl needs CUDA"):
        resolve_backend("nccl", torch.device("cpu"))


def test_one_process_ignores_the_strategy_with_a_note(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    d, device = setup_distributed(_cfg(strategy="ddp"), torch.device("cpu"))
    assert not d.active and d.world_size == 1 and device.type == "cpu"
    assert "ignored: one process" in d.notes[0]
    t = torch.tensor([2.0, 4.0])  # no-ops when not distributed
    assert d.reduce_mean_(t).tolist() == [2.0, 4.0] and d.broadcast_object("x") == "x"
    assert d.loss_reducer(device) is None


def test_torchrun_without_a_strategy_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ConfigError, match="WORLD_SIZE=2.*distributed.strategy is none.*strategy=ddp"):
        setup_distributed(_cfg(), torch.device("cpu"))
    with pytest.raises(ConfigError, match="every_minutes is not supported with distributed.strategy=fsdp"):
        setup_distributed(load_config({"distributed": {"strategy": "fsdp"},
                                       "checkpoint": {"every_minutes": 5}}), torch.device("cpu"))


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(3, 4)
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)])
        self.head = nn.Linear(4, 2)


def test_shard_units_are_the_parameterised_list_elements():
    m = Blocks()
    assert shard_units(m) == [m.blocks[0], m.blocks[2]]


def test_optimizer_state_round_trips_between_index_and_name_forms():
    torch.manual_seed(0)
    m = Blocks()
    opt = torch.optim.AdamW([{"params": [m.head.weight, m.emb.weight]},
                             {"params": [m.blocks[0].bias], "weight_decay": 0.0}], lr=0.1)
    loss = m.head(m.blocks[0](m.emb(torch.randn(2, 3)))).sum()
    loss.backward()
    opt.step()
    sd = opt.state_dict()
    names = ["head.weight", "emb.weight", "blocks.0.bias"]
    by_name = optim_state_by_name(sd, names)
    assert by_name["param_groups"][1]["params"] == ["blocks.0.bias"]
    assert torch.equal(by_name["state"]["emb.weight"]["exp_avg"], sd["state"][1]["exp_avg"])
    back = optim_state_by_index(by_name, names)
    assert back["param_groups"] == sd["param_groups"]
    assert all(torch.equal(back["state"][i]["exp_avg_sq"], sd["state"][i]["exp_avg_sq"]) for i in range(3))
    # a fresh optimizer loads the name-keyed form (what an FSDP job saves) without FSDP
    fresh = torch.optim.AdamW([{"params": [m.head.weight, m.emb.weight]},
                               {"params": [m.blocks[0].bias], "weight_decay": 0.0}], lr=0.1)
    OptimizerLoader(m, fresh, sharded=False).load_state_dict(by_name)
    assert torch.equal(fresh.state_dict()["state"][2]["exp_avg"], sd["state"][2]["exp_avg"])
    with pytest.raises(ConfigError, match="lacks: nope"):
        optim_state_by_index({"state": {}, "param_groups": [{"params": ["nope"]}]}, names)


def test_dist_inactive_close_monitor_is_plain_close():
    class Mon:
        closed = 0

        def close(self):
            self.closed += 1
            return {"ok": True}

    mon = Mon()
    assert Dist().close_monitor(mon) == {"ok": True} and mon.closed == 1


def test_collective_failures_become_errors_naming_the_rank_and_timeout():
    from trainspeed.engine.distributed import DistributedError, clear_error

    d = Dist(strategy="ddp", rank=1, world_size=4, backend="gloo", timeout_s=30)
    raw = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer.\nmore")
    err = clear_error(d, raw)
    assert isinstance(err, DistributedError)
    assert str(err).startswith("rank 1 of 4: the training step's collective failed (RuntimeError: [gloo")
    assert "more" not in str(err) and "distributed.timeout_s=30" in str(err)
    assert clear_error(d, ValueError("shapes")) is None           # not a collective failure
    assert clear_error(d, KeyboardInterrupt()) is None
    assert clear_error(Dist(), raw) is None                        # single process: left alone
