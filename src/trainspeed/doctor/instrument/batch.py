"""What a batch holds: samples, sequence length, tokens and padding (pure functions).

Padding is measured from an `attention_mask` when the batch has one (Hugging Face style),
otherwise from a detected pad id: in a 2-D integer tensor (batch, length) padded at the end,
most rows end with the same value, that value forms runs at the end of the rows, and it never
occurs inside a row's content (before its last other token). A value that also occurs inside
the content is a real token (a space ending character windows), never a pad id: no padding is
claimed from a guess the batch contradicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch

MAX_TENSORS = 32
"""Tensors inspected per batch at most (bounds the cost of a deeply nested batch)."""
PAD_MODE_SHARE = 0.5
"""The last-column value must end at least this share of the rows to be taken as a pad id."""
PAD_MIN_MEAN_RUN = 1.5
"""...and the rows ending in it must end in runs of it at least this long on average; a token
that ends rows by chance (a newline) forms runs of about 1."""

SEQ_FIRST_TYPES = (torch.nn.RNNBase, torch.nn.MultiheadAttention)
"""Layers whose input is (sequence, batch, ...) unless batch_first=True."""

_MASK_KEYS = ("attention_mask", "padding_mask", "mask")
_TOKEN_KEYS = ("input_ids", "tokens", "token_ids", "ids", "x", "input")


@dataclass(slots=True)
class BatchStats:
    samples: int
    """Leading dimension of the batch's first tensor."""
    seq_len: int | None = None
    """Second dimension of the token tensor, when the batch has one."""
    tokens: int = 0
    """Token positions in the batch (padding included): batch * seq_len."""
    pad_tokens: int | None = None
    """Padding positions, when measured (None: this batch was not sampled)."""
    pad_source: str | None = None
    """Where padding was read: "attention_mask" or "pad_id=<v>"."""
    beyond_longest: int | None = None
    """Padding positions past the batch's longest sample (measured with pad_tokens): what padding
    each batch to its own longest sample would remove. The rest of pad_tokens is the spread of
    lengths inside the batch, which only batching similar lengths together removes."""


def find_tensors(batch: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """(key path, tensor) pairs of a nested batch (dicts, lists, tuples, dataclass-like)."""
    out: list[tuple[str, torch.Tensor]] = []
    for item in _walk(batch, prefix, 0):
        out.append(item)
        if len(out) >= MAX_TENSORS:
            break
    return out


def _walk(obj: Any, key: str, depth: int) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield key, obj
    elif depth > 4:
        return
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _walk(v, str(k), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj[:MAX_TENSORS]):
            yield from _walk(v, key or str(i), depth + 1)


def _is_int(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex()) and t.dtype != torch.bool


def detect_pad_id(tokens: torch.Tensor) -> int | None:
    """The pad id of a right-padded (batch, length) integer tensor, or None if it looks
    unpadded. See PAD_MODE_SHARE and PAD_MIN_MEAN_RUN."""
    if tokens.dim() != 2 or tokens.shape[0] < 2 or tokens.shape[1] < 2 or not _is_int(tokens):
        return None
    last = tokens[:, -1]
    values, counts = torch.unique(last, return_counts=True)
    best = int(torch.argmax(counts))
    if int(counts[best]) < PAD_MODE_SHARE * tokens.shape[0]:
        return None
    pad = int(values[best])
    runs = trailing_runs(tokens, pad)
    ending = runs[runs > 0]
    if ending.numel() == 0 or float(ending.float().mean()) < PAD_MIN_MEAN_RUN:
        return None
    if int((tokens == pad).sum()) != int(runs.sum()):
        return None  # the value also occurs inside the content: a real token, not padding
    return pad


def trailing_runs(tokens: torch.Tensor, pad: int) -> torch.Tensor:
    """Per row, how many positions at the end equal `pad`."""
    length = tokens.shape[1]
    nonpad = tokens != pad
    positions = torch.arange(1, length + 1, device=tokens.device)
    last_real = (nonpad * positions).amax(dim=1)  # 0 when the whole row is padding
    return length - last_real


def _pick(tensors: list[tuple[str, torch.Tensor]], keys: tuple[str, ...], pred) -> tuple[str, torch.Tensor] | None:
    for wanted in keys:
        for key, t in tensors:
            if key == wanted and pred(t):
                return key, t
    return None


def batch_stats(batch: Any, *, measure_padding: bool = True) -> BatchStats | None:
    """Samples, tokens and (when `measure_padding`) padding of one batch; None when the batch
    holds no tensor with a batch dimension."""
    tensors = [(k, t) for k, t in find_tensors(batch) if t.dim() >= 1]
    if not tensors:
        return None
    stats = BatchStats(samples=int(tensors[0][1].shape[0]))
    is_tokens = lambda t: t.dim() == 2 and _is_int(t) and t.shape[1] > 1  # noqa: E731
    mask_item = _pick(tensors, _MASK_KEYS, lambda t: t.dim() == 2)
    token_item = _pick(tensors, _TOKEN_KEYS, is_tokens) or next(
        ((k, t) for k, t in tensors if is_tokens(t)), None)
    if mask_item is not None:
        mask = mask_item[1]
        stats.samples = int(mask.shape[0])
        stats.seq_len = int(mask.shape[1])
        stats.tokens = int(mask.numel())
        stats.pad_source = mask_item[0]
        if measure_padding:
            lengths = torch.count_nonzero(mask, dim=1)
            stats.pad_tokens = int(mask.numel() - int(lengths.sum()))
            longest = int(lengths.max()) if lengths.numel() else 0
            stats.beyond_longest = stats.samples * (stats.seq_len - longest)
        return stats
    if token_item is None:
        return stats
    tokens = token_item[1]
    stats.samples = int(tokens.shape[0])
    stats.seq_len = int(tokens.shape[1])
    stats.tokens = int(tokens.numel())
    if measure_padding:
        pad = detect_pad_id(tokens)
        if pad is None:
            stats.pad_tokens = stats.beyond_longest = 0
        else:
            runs = trailing_runs(tokens, pad)
            stats.pad_tokens = int(runs.sum())
            stats.beyond_longest = stats.samples * int(runs.min()) if runs.numel() else 0
            stats.pad_source = f"pad_id={pad}"
    return stats


def module_facts(module: torch.nn.Module) -> tuple[bool, bool]:
    """(has trainable parameters, holds a sequence-first layer) of a module called by the loop."""
    trainable = any(p.requires_grad for p in module.parameters())
    seq_first = trainable and any(isinstance(m, SEQ_FIRST_TYPES) and not getattr(m, "batch_first", False)
                                  for m in module.modules())
    return trainable, seq_first


def first_linear_width(module: torch.nn.Module) -> int | None:
    """in_features of the module's first layer with parameters when that layer is an
    nn.Linear (None otherwise): what a 1-D input of one sample's features has."""
    for m in module.modules():
        if next(m.parameters(recurse=False), None) is not None:
            return int(m.in_features) if isinstance(m, torch.nn.Linear) else None
    return None


def batch_dim_from_layer(layer: torch.nn.Module, args: tuple[Any, ...], model_input: tuple[int, ...]) -> int | None:
    """The batch dimension of a sequence-first model's input, from its first sequence-first
    layer's input (sequence, batch, features): the input dimension of the same size as that
    batch (0 on a tie or when none matches). None without evidence: a batch_first layer, an
    unbatched (2-D) input, a PackedSequence."""
    if getattr(layer, "batch_first", False) or not args or not isinstance(args[0], torch.Tensor):
        return None
    x = args[0]
    if x.dim() != 3:
        return None
    batch = int(x.shape[1])
    dims = [i for i, n in enumerate(model_input) if n == batch]
    return 0 if not dims or dims[0] == 0 else dims[0]
