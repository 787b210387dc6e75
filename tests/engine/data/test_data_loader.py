from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from trainspeed.config import DataConfig
from trainspeed.engine.data import (
    LengthBucketBatchSampler,
    PadCollate,
    ResumableSampler,
    batch_stats,
    build_dataloader,
    resolve_pin_memory,
)
from trainspeed.errors import CheckpointError

pytestmark = pytest.mark.timeout(120)


class SeqData(Dataset):
    """Sample i is a sequence of length lengths[i] filled with i (so batches reveal indices)."""

    def __init__(self, n: int = 96, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.lengths = np.clip(rng.lognormal(2.5, 0.9, n).astype(np.int64), 1, 100)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int):
        return {"input_ids": torch.full((int(self.lengths[i]),), i, dtype=torch.long)}


class AugData(Dataset):
    """Each sample draws from torch, random and numpy RNGs, like augmentation code does."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        return torch.tensor([float(i), torch.rand(()).item(), random.random(), float(np.random.rand())])


def ids_of(batch) -> list[int]:
    return batch["input_ids"][:, 0].tolist()


def build(cfg, data, **kw):
    return build_dataloader(data, cfg, lengths=data.lengths, seed=11, **kw)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("bucketing", [False, True])
@pytest.mark.parametrize("via", ["advance", "advancer"])
def test_resume_mid_epoch_same_remaining_batches(workers, bucketing, via):
    data = SeqData()
    cfg = DataConfig(batch_size=8, num_workers=workers, bucketing=bucketing, bucket_max_tokens=200 if bucketing else None)
    ref = build(cfg, data)
    ref.set_epoch(1)
    expected = [ids_of(b) for b in ref.loader]

    live = build(cfg, data)
    live.set_epoch(1)
    k, got = 5, []
    if via == "advancer":  # the Trainer's way: the sampler's own advance, in its unit
        step_advance, by_batches = live.advancer()
        advance = lambda samples, batches: step_advance(batches if by_batches else samples)  # noqa: E731
    else:
        advance = lambda samples, batches: live.advance(samples, batches=batches)  # noqa: E731
    for batch in live.loader:  # workers run ahead; only trained batches are advanced
        got.append(ids_of(batch))
        advance(batch_stats(batch).samples, 1)
        if len(got) == k:
            break
    state = live.state_dict()
    assert state["epoch"] == 1

    resumed = build(cfg, data)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    assert len(resumed) == len(expected) - k
    got += [ids_of(b) for b in resumed.loader]
    assert got == expected
    flat = sorted(i for b in got for i in b)
    assert flat == list(range(len(data)))


def test_bundle_state_kind_mismatch_is_an_error():
    data = SeqData()
    plain = build(DataConfig(batch_size=8), data)
    bucket = build(DataConfig(batch_size=8, bucketing=True), data)
    assert isinstance(plain.sampler, ResumableSampler)
    assert isinstance(bucket.sampler, LengthBucketBatchSampler)
    with pytest.raises(CheckpointError, match="bucketing"):
        bucket.load_state_dict(plain.state_dict())


def test_padding_mode_follows_config():
    data = SeqData()
    naive = build(DataConfig(batch_size=8, max_seq_len=64, shuffle=False), data)
    dyn = build(DataConfig(batch_size=8, max_seq_len=64, dynamic_padding=True, shuffle=False), data)
    assert naive.settings["pad_to"] == "max" and dyn.settings["pad_to"] == "longest"
    nb, db = next(iter(naive.loader)), next(iter(dyn.loader))
    assert nb["input_ids"].shape[1] == 64
    assert db["input_ids"].shape[1] == min(64, int(data.lengths[:8].max()))
    assert torch.equal(nb["lengths"], db["lengths"])
    sn, sd = batch_stats(nb), batch_stats(db)
    assert sn.tokens == sd.tokens and sn.pad_tokens > sd.pad_tokens
    # bucketing implies dynamic padding, and buckets by truncated length
    bk = build(DataConfig(batch_size=8, max_seq_len=64, bucketing=True), data)
    assert bk.settings["pad_to"] == "longest" and bk.settings["bucketing"]
    assert any("bucketing pads" in n for n in bk.notes)
    assert bk.sampler.lengths.max() <= 64


def test_recipe_padcollate_keeps_structure_and_gets_config_padding():
    data = SeqData()
    recipe_collate = PadCollate(keys=("input_ids",), label_keys=(), pad_id=5)
    b = build_dataloader(data, DataConfig(batch_size=4, pad_id=7, max_seq_len=32), collate_fn=recipe_collate)
    assert b.collate.keys == ("input_ids",) and b.collate.pad_id == 7
    assert b.collate.max_seq_len == 32 and b.collate.pad_to == "max"


def test_no_lengths_uses_default_collate_and_notes_ignored_switches():
    b = build_dataloader(AugData(), DataConfig(batch_size=4, bucketing=True, dynamic_padding=True))
    assert b.collate is None and not b.settings["bucketing"]
    assert any("bucketing ignored" in n for n in b.notes)
    assert next(iter(b.loader)).shape == (4, 4)


def test_worker_settings_applied():
    data = SeqData()
    b = build(DataConfig(batch_size=8, num_workers=2, persistent_workers=True, prefetch_factor=3), data)
    assert b.loader.num_workers == 2 and b.loader.persistent_workers and b.loader.prefetch_factor == 3
    assert b.loader.worker_init_fn is not None and b.loader.generator is b.generator

    class Duck:  # any object with DataConfig's fields works; invalid combos become notes
        batch_size, num_workers, pin_memory, persistent_workers, prefetch_factor = 4, 0, True, True, 4
        shuffle, drop_last, dynamic_padding, bucketing = True, True, True, False
        bucket_max_tokens, bucket_num_buckets, max_seq_len, pad_id = None, 8, None, 0

    d = build_dataloader(data, Duck(), lengths=data.lengths)
    assert not d.loader.persistent_workers
    notes = " ".join(d.notes)
    assert "persistent_workers ignored" in notes and "prefetch_factor ignored" in notes
    if not torch.cuda.is_available():
        assert "pin_memory=true has no effect" in notes and d.settings["pin_memory"] is False
    # drop_last: every batch full, and the sampler's epoch ends at a whole batch
    assert all(len(ids_of(x)) == 4 for x in d.loader)
    assert d.sampler.num_samples % 4 == 0
    # eval loaders never shuffle or drop
    ev = build_dataloader(data, Duck(), lengths=data.lengths, train=False)
    assert ev.settings["shuffle"] is False and ev.settings["drop_last"] is False


def test_resolve_pin_memory():
    assert resolve_pin_memory("auto", "cpu", True) == (False, None)
    assert resolve_pin_memory("auto", "cuda", True) == (True, None)
    assert resolve_pin_memory("auto", "cuda", False) == (False, None)
    pin, note = resolve_pin_memory(True, "cpu", False)
    assert pin is False and "no effect" in note
    assert resolve_pin_memory(False, "cuda", True) == (False, None)


def _epoch_values(bundle, epoch):
    bundle.set_epoch(epoch)
    return torch.cat(list(bundle.loader)).sort(dim=0).values


def test_worker_seeding_reproducible_and_epoch_dependent():
    cfg = DataConfig(batch_size=4, num_workers=2)
    a = build_dataloader(AugData(), cfg, seed=3)
    b = build_dataloader(AugData(), cfg, seed=3)
    a0 = torch.cat(list(a.loader))
    a0_again = torch.cat(list(a.loader))  # a second iterator of the same epoch: same seeds
    b0 = torch.cat(list(b.loader))
    assert torch.equal(a0, b0) and torch.equal(a0, a0_again)
    # python random and numpy are seeded per worker, not copied from the parent
    assert len(set(a0[:, 2].tolist())) == 16 and len(set(a0[:, 3].tolist())) == 16
    a.set_epoch(1)
    a1 = torch.cat(list(a.loader))
    assert not torch.equal(a1[:, 1:].sort(dim=0).values, a0[:, 1:].sort(dim=0).values)
    c = build_dataloader(AugData(), cfg, seed=4)
    assert not torch.equal(torch.cat(list(c.loader))[:, 1:].sort(dim=0).values, a0[:, 1:].sort(dim=0).values)
