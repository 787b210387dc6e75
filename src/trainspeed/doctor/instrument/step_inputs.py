"""What a doctor step trained on (samples, tokens, padding): the `StepInputs` methods of the
doctor's Session (session.py), which read and write the Session attributes named in the class
body (Session.__init__ sets them) and never import session.

Samples and tokens come from the DataLoader's training batches; a step without one counts the
input of its training module (the first module with trainable parameters that runs a training
forward: the model, not a parameterless loss module). The batch dimension of that input is 0,
unless the model holds a sequence-first layer (nn.LSTM/GRU/RNN or nn.MultiheadAttention with
batch_first=False): then it is the input dimension whose size equals the batch dimension of
the first such layer's input (an LM fed (35, 20) token ids whose LSTM sees (35, 20, E) has
20 samples). Token-id inputs (integer (batch, length) tensors) count batch * length tokens
(one tensor: nanoGPT's `model(X, Y)` counts X, not Y again), padding from an attention mask.
"""

from __future__ import annotations

from typing import Any

import torch

from trainspeed.doctor.instrument.batch import (batch_dim_from_layer, batch_stats, find_tensors, first_linear_width,
                                                module_facts)
from trainspeed.doctor.instrument.updates import Updates

SAMPLE_FIRST_BATCHES = 8
"""Padding is measured exactly on the first batches, then on every SAMPLE_EVERY-th one
(padding comes from the collate function, so it is stable batch to batch)."""
SAMPLE_EVERY = 8
MAX_MODULES = 64
"""Modules whose facts (trainable parameters, sequence-first layers) are cached at most."""
MAX_SHAPES = 64
"""Distinct training-module input shapes kept per step at most, each with its count: an RL
episode's hundreds of forwards of one (1, 4) state are one shape. Past that, an input counts as
the last shape kept (pytorch/examples' reinforce.py, whose 200-step episodes once read as 64
samples: the step kept its first 64 shapes)."""


class StepInputs:
    """Samples, tokens and padding of the open step (a mixin of Session: its attributes)."""

    internal: int
    accelerator: str | None
    loaders: dict[int, dict[str, Any]]
    observations: dict[str, dict[str, Any]]
    updates: Updates
    train_module: int | None
    module_facts: dict[int, tuple[bool, bool]]
    batch_dims: dict[int, int]
    seq_probe: tuple[int, tuple[int, ...]] | None
    batch_ids: set[int]
    batches_seen: int
    inputs_seen: int
    last_pad_share: float
    in_pad_source: str | None
    step_loader_batches: int
    step_samples: int
    step_tokens: int
    step_pad: int
    step_shapes: dict[tuple[int, ...], int]
    unbatched_widths: dict[int, int | None]
    step_in_tokens: int
    step_in_pad: int

    def observe(self, key: str, kind: str, **data: Any) -> bool:
        raise NotImplementedError  # Session's

    def on_batch(self, batch: Any, loader: int | None = None) -> None:
        """Account a training batch from a DataLoader (samples, tokens, padding); `loader`, the
        id of the DataLoader it came from when known, counts the loader's training fetches."""
        self.internal += 1
        try:
            info = self.loaders.get(loader) if loader is not None else None
            if info is not None:
                info["train_batches"] = info.get("train_batches", 0) + 1
            self.batches_seen += 1
            self.updates.loader_batches += 1
            sample = self.batches_seen <= SAMPLE_FIRST_BATCHES or self.batches_seen % SAMPLE_EVERY == 0
            stats = batch_stats(batch, measure_padding=sample)
            if stats is None:
                return
            # only CPU runs need to tell the loader's tensors from computed ones (syncs.py)
            if self.accelerator in (None, "cpu") and len(self.batch_ids) < 256:
                self.batch_ids.update(id(t) for _, t in find_tensors(batch))
            self.step_loader_batches += 1
            self.step_samples += stats.samples
            self.step_tokens += stats.tokens
            if stats.pad_tokens is not None:
                self.step_pad += stats.pad_tokens
                self.last_pad_share = stats.pad_tokens / stats.tokens if stats.tokens else 0.0
            else:  # not sampled: assume the padding share of the last measured batch
                self.step_pad += int(round(stats.tokens * self.last_pad_share))
            self._observe_shape(stats.samples, stats.seq_len, stats.pad_source)
            self._observe_padding(stats)
        finally:
            self.internal -= 1

    def _observe_shape(self, samples: int, seq_len: int | None, pad_source: str | None) -> None:
        obs = self.observations.get("batch")
        if obs is None:
            self.observe("batch", "batch", batch_size=samples, seq_len=seq_len,
                         pad_source=pad_source, max_batch_size=samples, max_seq_len=seq_len)
        else:
            obs["max_batch_size"] = max(obs.get("max_batch_size") or 0, samples)
            if seq_len is not None:
                obs["max_seq_len"] = max(obs.get("max_seq_len") or 0, seq_len)
            if obs.get("pad_source") is None and pad_source is not None:
                obs["pad_source"] = pad_source

    def _observe_padding(self, stats: Any) -> None:
        """Sums over the batches whose padding was measured: their positions, padding, and the
        padding past each batch's longest sample (checks/data.py splits the waste with them)."""
        obs = self.observations.get("batch")
        if obs is None or stats.pad_tokens is None or stats.beyond_longest is None or not stats.tokens:
            return
        obs["measured_tokens"] = obs.get("measured_tokens", 0) + stats.tokens
        obs["measured_pad"] = obs.get("measured_pad", 0) + stats.pad_tokens
        obs["beyond_longest"] = obs.get("beyond_longest", 0) + stats.beyond_longest

    def module_facts_of(self, module: torch.nn.Module) -> tuple[bool, bool]:
        """(has trainable parameters, holds a sequence-first layer); one pass per module."""
        facts = self.module_facts.get(id(module))
        if facts is None:
            self.internal += 1
            try:
                facts = module_facts(module)
            finally:
                self.internal -= 1
            if len(self.module_facts) < MAX_MODULES:
                self.module_facts[id(module)] = facts
        return facts

    def _account_input(self, module: torch.nn.Module, seq_first: bool, args: tuple[Any, ...]) -> None:
        key = id(module)
        self.internal += 1
        try:
            first = next((t for _, t in find_tensors(args) if t.dim() >= 1), None)
            if first is None:
                return
            shape = tuple(first.shape)
            if first.dim() == 1 and first.is_floating_point() and self._unbatched(module, shape[0]):
                shape = (1, shape[0])  # one sample's features, not a batch of shape[0]
            if shape in self.step_shapes or len(self.step_shapes) < MAX_SHAPES:
                self.step_shapes[shape] = self.step_shapes.get(shape, 0) + 1
            else:
                last = next(reversed(self.step_shapes))
                self.step_shapes[last] += 1
            if seq_first and key not in self.batch_dims and self.seq_probe is None and len(shape) >= 2:
                self.seq_probe = (key, shape)  # resolved by the first sequence-first layer's input
            self.inputs_seen += 1
            sample = self.inputs_seen <= SAMPLE_FIRST_BATCHES or self.inputs_seen % SAMPLE_EVERY == 0
            stats = batch_stats(list(args), measure_padding=sample)
            if stats is None or not stats.tokens:
                return
            self.step_in_tokens += stats.tokens
            if stats.pad_tokens is not None:
                self.step_in_pad += stats.pad_tokens
                self.last_pad_share = stats.pad_tokens / stats.tokens
            else:
                self.step_in_pad += int(round(stats.tokens * self.last_pad_share))
            if stats.pad_source is not None:
                self.in_pad_source = stats.pad_source
        finally:
            self.internal -= 1

    def _unbatched(self, module: torch.nn.Module, width: int) -> bool:
        """Is a 1-D float input of this length one sample (an actor-critic's bare (4,) state
        into `nn.Linear(4, 128)`)? True when the module's first layer with parameters is a
        Linear whose in_features is that length; a 1-D batch of scalars feeds no such layer."""
        key = id(module)
        if key not in self.unbatched_widths:
            found = first_linear_width(module)
            if len(self.unbatched_widths) >= MAX_MODULES:
                return found == width
            self.unbatched_widths[key] = found
        return self.unbatched_widths[key] == width

    def probe_sequence_layer(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        """The first sequence-first layer inside the training module's forward (autograd.py)."""
        dim = batch_dim_from_layer(module, args, self.seq_probe[1])  # type: ignore[index]
        if dim is not None:
            self.batch_dims[self.seq_probe[0]] = dim  # type: ignore[index]
            self.seq_probe = None

    def _input_samples(self) -> int:
        """Samples of the step's training-module inputs; observes the first as the batch."""
        if not self.step_shapes:
            return 0
        dim = self.batch_dims.get(self.train_module, 0) if self.train_module is not None else 0
        sizes = [(int(s[dim]) if len(s) > dim else int(s[0]), n) for s, n in self.step_shapes.items()]
        first = next(iter(self.step_shapes))
        seq_len = int(first[1 - dim]) if self.step_in_tokens and len(first) == 2 and dim < 2 else None
        self._observe_shape(sizes[0][0], seq_len, self.in_pad_source)
        return sum(size * n for size, n in sizes)

