"""PadCollate: turn variable-length samples into one padded batch plus mask and lengths.

Dynamic padding (`pad_to="longest"`) pads each batch to its own longest sample; the naive
way (`pad_to="max"`) pads every batch to `max_seq_len`, so short batches carry mostly
padding that the model still computes on. Both truncate to `max_seq_len`.

Output structure follows the sample structure:
  tensor sample           -> (ids [B, L], attention_mask [B, L] bool, lengths [B] int64)
  tuple sample (a, b, ..) -> (a_pad, b_pad, .., attention_mask, lengths)
  dict sample {k: ..}     -> {k: padded.., "attention_mask": .., "lengths": ..}
Labels (dict keys / tuple positions in `label_keys`) are padded with -100, the default
`ignore_index` of cross-entropy, so padding never contributes to the loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Hashable, Literal

from trainspeed.errors import ConfigError

__all__ = ["PadCollate", "IGNORE_INDEX"]

IGNORE_INDEX = -100
"""Label value of padded positions (cross-entropy's default ignore_index)."""


@dataclass(kw_only=True, slots=True)
class PadCollate:
    """Picklable collate_fn (safe to ship to DataLoader workers)."""

    pad_id: int = 0
    """Value written into padded positions of non-label sequences."""
    max_seq_len: int | None = None
    """Truncate sequences to this length; the padded length with pad_to='max'."""
    pad_to: Literal["longest", "max"] = "longest"
    """'longest': pad to the longest sample of the batch (dynamic); 'max': pad to max_seq_len."""
    keys: Sequence[Hashable] | None = None
    """Dict keys (or tuple positions) to pad; None: every 1-D tensor of the sample.
    Other entries are collated with PyTorch's default_collate."""
    label_keys: Sequence[Hashable] = ("labels",)
    """Dict keys / tuple positions padded with label_pad_id instead of pad_id."""
    label_pad_id: int = IGNORE_INDEX
    """Pad value of label sequences."""
    mask_key: Hashable | None = None
    """Sequence that defines attention_mask and lengths; None: 'input_ids' if present, else
    the first padded entry."""
    pad_multiple: int = 1
    """With pad_to='longest', round the padded length up to a multiple of this (8 or 64 keep
    tensor-core shapes; fewer distinct shapes also means fewer torch.compile recompiles)."""

    def __post_init__(self) -> None:
        if self.pad_to not in ("longest", "max"):
            raise ConfigError(f"PadCollate pad_to must be 'longest' or 'max', got {self.pad_to!r}")
        if self.max_seq_len is not None and self.max_seq_len < 1:
            raise ConfigError(f"PadCollate max_seq_len must be >= 1 or None, got {self.max_seq_len}")
        if self.pad_to == "max" and self.max_seq_len is None:
            raise ConfigError(
                "PadCollate pad_to='max' needs max_seq_len (the length to pad to); "
                "set max_seq_len or use pad_to='longest'"
            )
        if self.pad_multiple < 1:
            raise ConfigError(f"PadCollate pad_multiple must be >= 1, got {self.pad_multiple}")
        if self.keys is not None:
            self.keys = tuple(self.keys)
        self.label_keys = tuple(self.label_keys)

    # ------------------------------------------------------------------ public
    def __call__(self, samples: Sequence[Any]) -> Any:
        import torch

        if len(samples) == 0:
            raise ValueError("PadCollate got an empty batch")
        first = samples[0]
        if isinstance(first, torch.Tensor):
            padded, mask, lengths = self._pad_entry(list(samples), self.pad_id, primary=True)
            return padded, mask, lengths
        if isinstance(first, Mapping):
            names = list(first.keys())
            out, mask, lengths = self._collate_entries(names, [[s[k] for s in samples] for k in names])
            result = dict(zip(names, out))
            result["attention_mask"], result["lengths"] = mask, lengths
            return result
        if isinstance(first, (tuple, list)):
            names = list(range(len(first)))
            out, mask, lengths = self._collate_entries(names, [[s[i] for s in samples] for i in names])
            return (*out, mask, lengths)
        raise TypeError(
            f"PadCollate collates tensors, tuples or dicts of tensors; got {type(first).__name__}"
        )

    # ---------------------------------------------------------------- helpers
    def _is_sequence(self, name: Hashable, value: Any) -> bool:
        import torch

        if self.keys is not None:
            return name in self.keys
        return isinstance(value, torch.Tensor) and value.dim() == 1

    def _collate_entries(self, names: list, columns: list[list[Any]]) -> tuple[list, Any, Any]:
        from torch.utils.data import default_collate

        seq_names = [n for n, col in zip(names, columns) if self._is_sequence(n, col[0])]
        if not seq_names:
            raise ValueError(
                f"PadCollate found no sequence to pad among {names}; pass keys=[...] naming them"
            )
        if self.mask_key is not None:
            if self.mask_key not in seq_names:
                raise ValueError(f"PadCollate mask_key {self.mask_key!r} is not a padded entry {seq_names}")
            primary = self.mask_key
        else:
            primary = "input_ids" if "input_ids" in seq_names else seq_names[0]
        out, mask, lengths = [], None, None
        for name, col in zip(names, columns):
            if name not in seq_names:
                out.append(default_collate(col))
                continue
            value = self.label_pad_id if name in self.label_keys else self.pad_id
            padded, m, ln = self._pad_entry(col, value, primary=name == primary)
            if name == primary:
                mask, lengths = m, ln
            out.append(padded)
        return out, mask, lengths

    def _target_length(self, longest: int) -> int:
        if self.pad_to == "max":
            return int(self.max_seq_len)  # type: ignore[arg-type]
        m = self.pad_multiple
        length = -(-longest // m) * m if longest else m
        if self.max_seq_len is not None:
            length = max(longest, min(length, self.max_seq_len))
        return length

    def _pad_entry(self, seqs: list[Any], value: int, *, primary: bool) -> tuple[Any, Any, Any]:
        import torch

        limit = self.max_seq_len
        lens = [min(int(s.shape[0]), limit) if limit is not None else int(s.shape[0]) for s in seqs]
        length = self._target_length(max(lens))
        ref = seqs[0]
        out = ref.new_full((len(seqs), length, *ref.shape[1:]), value)
        for i, (s, n) in enumerate(zip(seqs, lens)):
            if s.shape[1:] != ref.shape[1:]:
                raise ValueError(
                    f"PadCollate pads along the first dimension only; sample {i} has shape "
                    f"{tuple(s.shape)} but sample 0 has {tuple(ref.shape)}"
                )
            out[i, :n] = s[:n]
        if not primary:
            return out, None, None
        lengths = torch.tensor(lens, dtype=torch.int64)
        mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
        return out, mask, lengths
