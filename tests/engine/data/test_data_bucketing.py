from __future__ import annotations

import numpy as np
import pytest
import torch

from trainspeed.engine.data import LengthBucketBatchSampler, PadCollate, padded_tokens
from trainspeed.errors import CheckpointError, ConfigError

pytestmark = pytest.mark.timeout(60)


def long_tail(n: int = 2000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(4.0, 0.9, n).astype(np.int64), 1, 1024)


LENGTHS = long_tail()


@pytest.mark.parametrize("seed", [0, 1, 5])
@pytest.mark.parametrize("budget", [dict(batch_size=32), dict(max_tokens=4096), dict(max_tokens=4096, batch_size=16)])
def test_every_sample_once_per_epoch_and_budget_respected(seed, budget):
    s = LengthBucketBatchSampler(LENGTHS, seed=seed, **budget)
    for epoch in (0, 1):
        s.set_epoch(epoch)
        batches = list(s)
        assert len(batches) == len(s)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(len(LENGTHS)))
        for b in batches:
            if "batch_size" in budget:
                assert len(b) <= budget["batch_size"]
            if "max_tokens" in budget and len(b) > 1:
                assert LENGTHS[b].max() * len(b) <= budget["max_tokens"]


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("budget", [dict(batch_size=32), dict(max_tokens=4096)])
@pytest.mark.parametrize("n", [2000, 1999, 37])
def test_two_ranks_disjoint_covering_equal_counts(seed, budget, n):
    lengths = LENGTHS[:n]
    shards = [list(LengthBucketBatchSampler(lengths, seed=seed, rank=r, world_size=2, **budget)) for r in (0, 1)]
    assert len(shards[0]) == len(shards[1]), "ranks must run the same number of steps"
    s0 = {i for b in shards[0] for i in b}
    s1 = {i for b in shards[1] for i in b}
    assert not s0 & s1
    assert s0 | s1 == set(range(n))
    assert sum(len(b) for sh in shards for b in sh) == n


def test_drop_last_drops_only_incomplete_batches():
    s = LengthBucketBatchSampler(LENGTHS, batch_size=32, drop_last=True, world_size=2, rank=0)
    both = list(s) + list(LengthBucketBatchSampler(LENGTHS, batch_size=32, drop_last=True, world_size=2, rank=1))
    assert all(len(b) == 32 for b in both)
    flat = [i for b in both for i in b]
    assert len(flat) == len(set(flat)) and len(flat) >= len(LENGTHS) - 8 * 32 - 32


def test_order_is_deterministic_and_shuffled_per_epoch():
    a = LengthBucketBatchSampler(LENGTHS, batch_size=32, seed=4)
    b = LengthBucketBatchSampler(LENGTHS, batch_size=32, seed=4)
    assert list(a) == list(b)
    e0 = list(a)
    a.set_epoch(1)
    assert list(a) != e0
    # batch order is mixed: lengths of consecutive batches are not sorted
    maxima = [int(LENGTHS[bt].max()) for bt in e0]
    assert maxima != sorted(maxima) and maxima != sorted(maxima, reverse=True)


def test_cuts_padding_versus_random_batching():
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(LENGTHS))
    random_batches = [perm[i : i + 32].tolist() for i in range(0, len(perm), 32)]
    real_r, pad_random = padded_tokens(random_batches, LENGTHS)
    for budget in (dict(batch_size=32), dict(max_tokens=4096)):
        bucketed = list(LengthBucketBatchSampler(LENGTHS, num_buckets=8, **budget))
        real_b, pad_bucket = padded_tokens(bucketed, LENGTHS)
        assert real_b == real_r == int(LENGTHS.sum())
        reduction = 1 - pad_bucket / pad_random
        assert reduction > 0.6, f"{budget}: pad tokens cut only by {reduction:.0%}"
    # pad-to-max (the naive way) is worse still
    assert len(LENGTHS) * 1024 - LENGTHS.sum() > pad_random


class CausalTagger(torch.nn.Module):
    """Per-token logits that depend only on the token and its left context (GRU), so
    right-padding cannot change any real position's output."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 16)
        self.rnn = torch.nn.GRU(16, 16, batch_first=True)
        self.out = torch.nn.Linear(16, 50)

    def forward(self, ids):
        return self.out(self.rnn(self.emb(ids))[0])


def _mean_loss(model, samples, batches, collate):
    """Token-weighted masked mean of the cross-entropy over all samples."""
    total, count = torch.zeros((), dtype=torch.float64), 0
    for b in batches:
        batch = collate([samples[i] for i in b])
        logits = model(batch["input_ids"])
        per_tok = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["labels"], reduction="none")
        mask = batch["attention_mask"]
        assert torch.equal(batch["labels"] != -100, mask)
        total += (per_tok * mask).sum().double()
        count += int(mask.sum())
    return (total / count).item(), count


def test_masked_loss_identical_for_padded_and_bucketed_batches():
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(2.5, 0.8, 120).astype(np.int64), 2, 64)
    samples = []
    for ln in lengths:
        seq = torch.from_numpy(rng.integers(1, 50, ln + 1))
        samples.append({"input_ids": seq[:-1], "labels": seq[1:]})
    model = CausalTagger().eval()
    perm = rng.permutation(len(samples))
    naive_batches = [perm[i : i + 16].tolist() for i in range(0, len(perm), 16)]
    with torch.no_grad():
        naive, n1 = _mean_loss(model, samples, naive_batches, PadCollate(max_seq_len=64, pad_to="max"))
        bucketed_batches = list(LengthBucketBatchSampler(lengths, max_tokens=256, num_buckets=4))
        bucketed, n2 = _mean_loss(model, samples, bucketed_batches, PadCollate(max_seq_len=64))
    assert n1 == n2 == int(lengths.sum())
    assert bucketed == pytest.approx(naive, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("budget", [dict(batch_size=32), dict(max_tokens=4096)])
def test_resume_mid_epoch_identical_remaining_order(budget):
    ref = LengthBucketBatchSampler(LENGTHS, seed=9, world_size=2, rank=1, **budget)
    ref.set_epoch(3)
    order = list(ref)
    live = LengthBucketBatchSampler(LENGTHS, seed=9, world_size=2, rank=1, **budget)
    live.set_epoch(3)
    it = iter(live)
    pulled = [next(it) for _ in range(7)]  # prefetch ran ahead of training
    live.advance(5)
    state = live.state_dict()
    fresh = LengthBucketBatchSampler(LENGTHS, seed=9, world_size=2, rank=1, **budget)
    fresh.load_state_dict(state)
    fresh.set_epoch(3)
    assert pulled[:5] + list(fresh) == order
    assert len(fresh) == len(order) - 5
    fresh.advance(len(fresh))
    assert (fresh.epoch, fresh.consumed) == (4, 0)


def test_validation_and_state_errors():
    with pytest.raises(ConfigError, match="max_tokens, batch_size"):
        LengthBucketBatchSampler([1, 2, 3])
    with pytest.raises(ConfigError, match="bucket_num_buckets"):
        LengthBucketBatchSampler([1, 2], batch_size=1, num_buckets=0)
    s = LengthBucketBatchSampler([5, 500, 6], max_tokens=100)
    assert s.notes and "longer than" in s.notes[0]
    assert sorted(i for b in s for i in b) == [0, 1, 2]
    with pytest.raises(CheckpointError, match="world_size"):
        s.load_state_dict({"epoch": 0, "consumed": 0, "world_size": 2})
