"""Exact resume through the Trainer: 2N steps straight == N steps, stop, resume, N more —
identical losses and parameters bit for bit on CPU, stopping mid-epoch."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainspeed.engine.events import Callback
from trainspeed.engine.trainer import Trainer
from trainspeed.telemetry import read_run

pytestmark = pytest.mark.timeout(240)


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(80, 6, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(80, 1, generator=g))


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 1))


def mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


class StopAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_batch_end(self, state):
        if state.step == self.step:
            state.should_stop = True


def _cfg(tmp_path, name, workers, **ckpt):
    return {"run": {"out_dir": str(tmp_path), "name": name, "max_steps": 16, "seed": 7},
            "data": {"batch_size": 8, "shuffle": True, "num_workers": workers},
            "optim": {"schedule": "cosine", "warmup_steps": 3},
            "logging": {"every": 4, "warmup_steps": 0, "progress": False},
            "eval": {"at_end": False}, "checkpoint": {"save_final": True, "async_save": True, **ckpt}}


@pytest.mark.parametrize("workers", [0, 2])
def test_stop_mid_epoch_and_resume_is_bit_exact(tmp_path, workers):
    straight = _model()
    Trainer(straight, mse, _data(), config=_cfg(tmp_path, "straight", workers)).fit()
    # 10 batches per epoch: stopping at step 7 is mid-epoch
    first = _model()
    Trainer(first, mse, _data(), config=_cfg(tmp_path, "part", workers), callbacks=[StopAt(7)]).fit()
    ckpt = tmp_path / "part" / "checkpoints" / "step-00000007.pt"
    assert ckpt.exists()
    resumed = _model()  # fresh weights: everything must come from the checkpoint
    Trainer(resumed, mse, _data(), config=_cfg(tmp_path, "part", workers, auto_resume=True)).fit()
    for p, q in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
    a = {r["step"]: r["loss"] for r in read_run(tmp_path / "straight").steps}
    b = {r["step"]: r["loss"] for r in read_run(tmp_path / "part").steps}
    assert sorted(b) == list(range(1, 17))
    assert [b[i] for i in range(1, 17)] == [a[i] for i in range(1, 17)]
    restarts = [e["data"] for e in read_run(tmp_path / "part").events_of("restart")]
    assert any(d.get("at_step") == 7 for d in restarts), restarts


def test_wrong_model_checkpoint_is_a_clear_error(tmp_path):
    Trainer(_model(), mse, _data(), config=_cfg(tmp_path, "a", 0)).fit()
    path = tmp_path / "a" / "checkpoints" / "step-00000016.pt"
    wider = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 1))
    from trainspeed.errors import CheckpointError

    with pytest.raises(CheckpointError, match="shape"):
        Trainer(wider, mse, _data(), config=_cfg(tmp_path, "b", 0, resume=str(path))).fit()


class _Sequences(torch.utils.data.Dataset):
    """Variable-length token sequences (lengths 3..40) for bucketing + dynamic padding."""

    def __init__(self, n=96):
        g = torch.Generator().manual_seed(5)
        self.lengths = torch.randint(3, 41, (n,), generator=g).tolist()
        self.items = [torch.randint(1, 50, (n_,), generator=g) for n_ in self.lengths]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i]}


class _Bag(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 8, padding_idx=0)
        self.head = nn.Linear(8, 1)

    def forward(self, ids, mask):
        pooled = (self.emb(ids) * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return self.head(pooled).squeeze(-1)


def _seq_loss(model, batch):
    ids, mask = batch["input_ids"], batch["attention_mask"]
    target = mask.sum(1).float() / 40  # predict the (normalised) length
    return nn.functional.mse_loss(model(ids, mask.float()), target)


def _bucket_cfg(tmp_path, name, **ckpt):
    cfg = _cfg(tmp_path, name, 0, **ckpt)
    cfg["data"].update({"bucketing": True, "dynamic_padding": True, "bucket_num_buckets": 4,
                        "batch_size": 8})
    cfg["logging"]["every"] = 1
    return cfg


def test_bucketing_resume_continues_the_same_batches(tmp_path):
    """Length-bucketed batches (shuffled within and across buckets) after a mid-epoch stop
    and resume are the very batches of the straight run: same shapes, losses and weights."""
    data = _Sequences()
    straight = _Bag()
    Trainer(straight, _seq_loss, data, config=_bucket_cfg(tmp_path, "straight"),
            lengths=data.lengths).fit()
    first = _Bag()
    Trainer(first, _seq_loss, data, config=_bucket_cfg(tmp_path, "part"), lengths=data.lengths,
            callbacks=[StopAt(5)]).fit()
    resumed = _Bag()
    Trainer(resumed, _seq_loss, data, config=_bucket_cfg(tmp_path, "part", auto_resume=True),
            lengths=data.lengths).fit()
    for p, q in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
    a = {r["step"]: r for r in read_run(tmp_path / "straight").steps}
    b = {r["step"]: r for r in read_run(tmp_path / "part").steps}
    assert sorted(b) == list(range(1, 17))
    for i in range(1, 17):  # same batch: same real and padded token counts, same loss
        assert (b[i]["tokens"], b[i].get("pad_tokens"), b[i]["loss"]) == \
            (a[i]["tokens"], a[i].get("pad_tokens"), a[i]["loss"]), f"step {i}"
    # bucketing really did cut padding compared with padding to the longest sample overall
    assert sum(r.get("pad_tokens") or 0 for r in a.values()) < 0.25 * sum(r["tokens"] for r in a.values())
