from __future__ import annotations

import pickle

import pytest
import torch

from trainspeed.engine.data import BatchStats, PadCollate, batch_stats, pad_share
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(30)

T = lambda *xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731


def test_tensor_samples_pad_to_longest():
    ids, mask, lengths = PadCollate(pad_id=9)([T(1, 2, 3), T(4), T(5, 6)])
    assert ids.tolist() == [[1, 2, 3], [4, 9, 9], [5, 6, 9]]
    assert mask.dtype == torch.bool
    assert mask.tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    assert lengths.tolist() == [3, 1, 2]
    assert lengths.dtype == torch.int64


def test_pad_to_max_and_truncation():
    c = PadCollate(max_seq_len=4, pad_to="max")
    ids, mask, lengths = c([T(1, 2, 3, 4, 5, 6), T(7)])
    assert ids.tolist() == [[1, 2, 3, 4], [7, 0, 0, 0]]
    assert lengths.tolist() == [4, 1]
    assert mask.sum().item() == 5
    # longest mode truncates too, and a short batch stays short
    ids, _, lengths = PadCollate(max_seq_len=4)([T(1, 2, 3, 4, 5, 6), T(7)])
    assert ids.shape == (2, 4) and lengths.tolist() == [4, 1]
    ids, _, _ = PadCollate(max_seq_len=4)([T(1), T(2, 3)])
    assert ids.shape == (2, 2)


def test_pad_multiple_rounds_up_but_not_past_max():
    ids, mask, _ = PadCollate(pad_multiple=8)([T(1, 2, 3)])
    assert ids.shape == (1, 8) and mask.sum().item() == 3
    ids, _, _ = PadCollate(pad_multiple=8, max_seq_len=5)([T(1, 2, 3)])
    assert ids.shape == (1, 5)


def test_dict_samples_labels_get_ignore_index_and_scalars_are_stacked():
    samples = [
        {"input_ids": T(1, 2), "labels": T(2, 3), "cls": torch.tensor(0)},
        {"input_ids": T(4, 5, 6), "labels": T(5, 6, 7), "cls": torch.tensor(1)},
    ]
    out = PadCollate(pad_id=0)(samples)
    assert set(out) == {"input_ids", "labels", "cls", "attention_mask", "lengths"}
    assert out["input_ids"].tolist() == [[1, 2, 0], [4, 5, 6]]
    assert out["labels"].tolist() == [[2, 3, -100], [5, 6, 7]]
    assert out["cls"].tolist() == [0, 1]
    assert out["attention_mask"].tolist() == [[True, True, False], [True, True, True]]
    assert out["lengths"].tolist() == [2, 3]


def test_tuple_samples_with_label_position():
    x, y, mask, lengths = PadCollate(label_keys=(1,))([(T(1), T(1)), (T(2, 3), T(2, 3))])
    assert x.tolist() == [[1, 0], [2, 3]]
    assert y.tolist() == [[1, -100], [2, 3]]
    assert lengths.tolist() == [1, 2] and mask.tolist() == [[True, False], [True, True]]


def test_keys_select_2d_sequences_and_mask_key():
    # [T, D] feature sequences are padded when named; the mask follows mask_key
    samples = [{"feats": torch.ones(2, 3), "ids": T(1, 2, 3, 4)}, {"feats": torch.ones(1, 3), "ids": T(5)}]
    out = PadCollate(keys=("feats", "ids"), mask_key="feats")(samples)
    assert out["feats"].shape == (2, 2, 3)
    assert out["feats"][1, 1].tolist() == [0.0, 0.0, 0.0]
    assert out["lengths"].tolist() == [2, 1]
    assert out["ids"].shape == (2, 4)


def test_batch_stats_counts_real_and_pad_tokens():
    batch = PadCollate()([T(1, 2, 3), T(4), T(5, 6)])
    s = batch_stats(batch)
    assert s == BatchStats(samples=3, tokens=6, pad_tokens=3)
    assert pad_share(s) == pytest.approx(3 / 9)
    s = batch_stats(PadCollate(max_seq_len=10, pad_to="max")([T(1, 2, 3), T(4)]))
    assert (s.samples, s.tokens, s.pad_tokens) == (2, 4, 16)
    d = PadCollate()([{"input_ids": T(1)}, {"input_ids": T(1, 2)}])
    assert batch_stats(d) == BatchStats(samples=2, tokens=3, pad_tokens=1)
    # non-sequence batch: samples from the first tensor, no token counts
    assert batch_stats((torch.zeros(5, 3, 8, 8), torch.zeros(5))) == BatchStats(samples=5)


def test_picklable_and_validation():
    c = PadCollate(pad_id=3, max_seq_len=7, pad_to="max", keys=["input_ids"])
    c2 = pickle.loads(pickle.dumps(c))
    assert c2 == c and c2([{"input_ids": T(1)}])["input_ids"].tolist() == [[1, 3, 3, 3, 3, 3, 3]]
    with pytest.raises(ConfigError, match="max_seq_len"):
        PadCollate(pad_to="max")
    with pytest.raises(ConfigError, match="pad_to"):
        PadCollate(pad_to="min")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        PadCollate()([])
    with pytest.raises(ValueError, match="no sequence"):
        PadCollate()([{"x": torch.tensor(1.0)}])
