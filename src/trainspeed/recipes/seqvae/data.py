"""Variable-length token sequences with a long-tailed length distribution and learnable
structure, generated in memory from a seed (no files, no download).

Lengths are lognormal (median `median_len`, shape `len_sigma`) clipped to [min_len, max_len]:
most sequences are short, a few are very long, which is exactly where padding every batch to
the maximum wastes most of the compute. Each sequence has a hidden "style" (one of
`num_styles`) and its tokens follow that style's sparse Markov chain, so a latent code that
captures the style improves reconstruction (a VAE has something to encode).

Token ids: 0 = PAD, 1 = BOS (the decoder's start token), 2.. = data tokens.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

PAD, BOS, FIRST_TOKEN = 0, 1, 2


def sample_lengths(n: int, *, median: float, sigma: float, low: int, high: int, rng: np.random.Generator) -> np.ndarray:
    """n lognormal lengths with the given median, clipped to [low, high]."""
    raw = rng.lognormal(mean=np.log(median), sigma=sigma, size=n)
    return np.clip(np.rint(raw), low, high).astype(np.int64)


def style_chains(num_styles: int, vocab: int, rng: np.random.Generator, concentration: float = 0.1) -> np.ndarray:
    """Cumulative transition tables (styles, vocab, vocab): a sparse Dirichlet row per token,
    so each token has a few likely successors that differ between styles."""
    probs = rng.dirichlet(np.full(vocab, concentration), size=(num_styles, vocab))
    cum = np.cumsum(probs, axis=-1)
    cum[..., -1] = 1.0  # guard against rounding: the last bucket always catches u < 1
    return cum


def generate(n: int, *, vocab_size: int, num_styles: int, median: float, sigma: float, low: int,
             high: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat token array, offsets (n+1,), styles (n,)); sequence i is flat[offsets[i]:offsets[i+1]].

    All sequences advance one position per iteration (vectorized over n), so generating
    ~10^5-10^6 tokens takes well under a second.
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    vocab = vocab_size - FIRST_TOKEN
    chains = style_chains(num_styles, vocab, rng)
    lengths = sample_lengths(n, median=median, sigma=sigma, low=low, high=high, rng=rng)
    styles = rng.integers(0, num_styles, size=n)
    # Longest first: at position t only the first `alive` sequences still need a token, so the
    # work is proportional to the total token count, not n x the longest length.
    order = np.argsort(-lengths, kind="stable")
    sorted_len, sorted_style = lengths[order], styles[order]
    out = np.zeros((n, int(lengths.max())), dtype=np.int64)
    cur = rng.integers(0, vocab, size=n)
    out[:, 0] = cur
    for t in range(1, out.shape[1]):
        alive = int(np.searchsorted(-sorted_len, -t, side="left"))  # sequences with length > t
        u = rng.random(alive)
        rows = chains[sorted_style[:alive], cur[:alive]]  # cumulative probabilities of the next token
        cur = np.minimum((rows < u[:, None]).sum(axis=1), vocab - 1)
        out[:alive, t] = cur
    out[order] = out.copy()  # back to the original sample order
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.concatenate([out[i, : lengths[i]] for i in range(n)]) + FIRST_TOKEN
    return flat, offsets, styles


class SequenceDataset(Dataset):
    """Item i -> 1-D int64 tensor of its tokens (variable length); `lengths` for bucketing."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray, styles: np.ndarray | None = None):
        self.flat = torch.from_numpy(np.ascontiguousarray(flat, dtype=np.int64))
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.styles = styles
        self.lengths = np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} sequences")
        return self.flat[self.offsets[i] : self.offsets[i + 1]]


def make_datasets(o, seed: int) -> tuple[SequenceDataset, SequenceDataset]:
    """Train and validation sets from SeqVAEOptions `o`: one generator run, split at the end
    (same styles and chains; disjoint sequences)."""
    n_train, n_val = o.samples, o.val_samples
    flat, offsets, styles = generate(
        n_train + n_val, vocab_size=o.vocab_size, num_styles=o.num_styles, median=o.median_len,
        sigma=o.len_sigma, low=o.min_len, high=o.max_len, seed=seed,
    )
    cut = offsets[n_train]
    train = SequenceDataset(flat[:cut], offsets[: n_train + 1], styles[:n_train])
    val = SequenceDataset(flat[cut:], offsets[n_train:] - cut, styles[n_train:])
    return train, val
