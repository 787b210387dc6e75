from __future__ import annotations

import pytest
import torch

from trainspeed.doctor.instrument.batch import batch_stats, detect_pad_id, trailing_runs

pytestmark = pytest.mark.timeout(30)


def _padded(lengths, total, pad=0):
    rows = []
    for n in lengths:
        row = torch.full((total,), pad, dtype=torch.long)
        row[:n] = torch.arange(1, n + 1) + 5
        rows.append(row)
    return torch.stack(rows)


def test_pad_id_and_trailing_runs_of_right_padded_tokens():
    x = _padded([3, 5, 8, 2], 8, pad=0)
    assert detect_pad_id(x) == 0
    assert trailing_runs(x, 0).tolist() == [5, 3, 0, 6]
    stats = batch_stats((x, torch.zeros(4)))
    assert (stats.samples, stats.seq_len, stats.tokens, stats.pad_tokens) == (4, 8, 32, 14)
    assert stats.pad_source == "pad_id=0"


def test_unpadded_tokens_and_coincidental_last_token_are_not_padding():
    g = torch.Generator().manual_seed(0)
    assert detect_pad_id(torch.randint(0, 1000, (16, 32), generator=g)) is None
    x = torch.randint(1, 1000, (4, 16), generator=g)
    x[:, -1] = 10  # every row ends with a newline-like token, but runs are of length 1
    assert detect_pad_id(x) is None
    assert batch_stats({"input_ids": x}).pad_tokens == 0


def test_attention_mask_takes_precedence_and_dict_batches():
    ids = torch.randint(1, 50, (2, 6))
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    stats = batch_stats({"input_ids": ids, "attention_mask": mask, "labels": ids})
    assert (stats.samples, stats.tokens, stats.pad_tokens, stats.pad_source) == (2, 12, 3, "attention_mask")


def test_images_have_samples_but_no_tokens_and_empty_batches_none():
    stats = batch_stats([torch.rand(8, 3, 4, 4), torch.randint(0, 10, (8,))])
    assert (stats.samples, stats.tokens, stats.pad_tokens) == (8, 0, None)
    assert batch_stats({"meta": "x"}) is None
    assert batch_stats(torch.zeros(())) is None


def test_unsampled_batch_leaves_padding_unmeasured():
    stats = batch_stats(_padded([1, 2], 6), measure_padding=False)
    assert stats.tokens == 12 and stats.pad_tokens is None
