"""batch.auto_microbatch: an out-of-memory step is split and retried, the global batch kept."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainspeed.engine.microbatch import MicroBatcher, MicroBatchTooLargeError, auto_microbatch_enabled, is_oom
from trainspeed.engine.trainer import Trainer
from trainspeed.errors import ConfigError
from trainspeed.recipes.base import BatchStats
from trainspeed.telemetry import read_run

pytestmark = pytest.mark.timeout(120)


class MemoryLimited(nn.Module):
    """A real model whose forward fails like the CUDA allocator above `limit` samples."""

    def __init__(self, limit: int | None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        self.limit = limit
        self.seen: list[int] = []

    def forward(self, x):
        self.seen.append(int(x.shape[0]))
        if self.limit is not None and x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (batch of {x.shape[0]})")
        return self.net(x)


def mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def _data(n=48):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g))


def _fit(tmp_path, name, limit, auto=True, steps=6, accumulation=1):
    model = MemoryLimited(limit)
    cfg = {
        "run": {"out_dir": str(tmp_path), "name": name, "max_steps": steps, "seed": 3},
        "data": {"batch_size": 12, "shuffle": False},
        "optim": {"name": "sgd", "lr": 0.05, "implementation": "loop"},
        "accumulation": {"steps": accumulation},
        "batch": {"auto_microbatch": auto},
        "logging": {"every": 1, "warmup_steps": 0, "progress": False},
        "checkpoint": {"save_final": False},
        "eval": {"at_end": False},
    }
    trainer = Trainer(model, mse, _data(), config=cfg)
    trainer.fit()
    return model, read_run(tmp_path / name)


def test_oom_halves_the_micro_batch_and_keeps_the_math(tmp_path):
    reference, ref_run = _fit(tmp_path, "ref", limit=None)
    model, run = _fit(tmp_path, "auto", limit=4)  # 12 fails, 6 fails, 3 fits
    events = [e["data"] for e in run.events_of("auto_microbatch")]
    assert [(e["previous_micro_batch"], e["micro_batch"]) for e in events] == [(12, 6), (6, 3)]
    assert [e["split"] for e in events] == [2, 4]
    assert all(e["at_step"] == 1 for e in events)  # found on the first step, then kept
    assert "out of memory" in events[0]["error"]
    assert max(model.seen[-4:]) == 3 and len(run.steps) == 6
    # Same global batch, same optimizer steps: the same weights and losses as without OOM.
    for a, b in zip(reference.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    ref_losses = [r["loss"] for r in ref_run.steps]
    losses = [r["loss"] for r in run.steps]
    assert losses == pytest.approx(ref_losses, rel=1e-5)


def test_with_accumulation_each_micro_batch_is_split(tmp_path):
    reference, _ = _fit(tmp_path, "ref", limit=None, accumulation=2, steps=3)
    model, run = _fit(tmp_path, "auto", limit=8, accumulation=2, steps=3)
    assert [e["data"]["split"] for e in run.events_of("auto_microbatch")] == [2]
    assert model.seen[-4:] == [6, 6, 6, 6]  # 2 micro-batches x 2 pieces per step
    for a, b in zip(reference.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_without_the_switch_the_oom_propagates(tmp_path):
    with pytest.raises(torch.OutOfMemoryError):
        _fit(tmp_path, "off", limit=4, auto=False)


def test_one_sample_that_does_not_fit_is_a_clear_error(tmp_path):
    with pytest.raises(MicroBatchTooLargeError, match="micro-batch of one sample"):
        _fit(tmp_path, "tiny", limit=0)


def test_other_errors_are_not_retried(tmp_path):
    class Broken(MemoryLimited):
        def forward(self, x):
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    cfg = {"run": {"out_dir": str(tmp_path), "name": "b", "max_steps": 2},
           "batch": {"auto_microbatch": True}, "logging": {"progress": False},
           "checkpoint": {"save_final": False, "save_on_crash": False}}
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        Trainer(Broken(None), mse, _data(), config=cfg).fit()


def test_is_oom_recognises_allocator_messages():
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"))
    assert is_oom(RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"))
    assert not is_oom(RuntimeError("expected scalar type Float but found Half"))
    assert not is_oom(ValueError("out of memory"))  # not an allocator error type


def test_token_weighted_pieces_sum_to_the_batch_weight():
    mb = MicroBatcher(split=2)
    ids = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]])
    stats = lambda b: BatchStats(samples=len(b), tokens=int((b != 0).sum()))  # noqa: E731
    pieces = mb.pieces([ids], [1.0], "tokens", stats)
    # 5 real tokens in the first half, 5 in the second: equal shares of the step's mean.
    assert [p.weight for p in pieces] == pytest.approx([0.5, 0.5])
    pieces = mb.pieces([ids[:3]], [0.6], "mean", stats)  # 3 samples -> pieces of 2 and 1
    assert [p.weight for p in pieces] == pytest.approx([0.4, 0.2])


def test_distributed_runs_refuse_the_switch(tmp_path, monkeypatch):
    from trainspeed.engine.distributed import Dist

    # rank 0 of 2, as torchrun would make it (without forming a process group)
    monkeypatch.setattr("trainspeed.engine.distributed.setup_distributed",
                        lambda cfg, device: (Dist(strategy="ddp", rank=0, world_size=2), device))
    with pytest.raises(ConfigError, match="single process"):
        Trainer(MemoryLimited(None), mse, _data(),
                config={"run": {"out_dir": str(tmp_path)}, "batch": {"auto_microbatch": True}})


def test_auto_microbatch_is_refused_with_several_ranks():
    assert auto_microbatch_enabled(True, 1) is True
    assert auto_microbatch_enabled(False, 4) is False
    with pytest.raises(ConfigError, match="single process only"):
        auto_microbatch_enabled(True, 2)
