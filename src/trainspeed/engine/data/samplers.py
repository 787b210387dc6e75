"""ResumableSampler: a seeded, rank-sharded sampler that resumes mid-epoch exactly.

The order of epoch `e` is a pure function of (seed, epoch): a torch.randperm drawn from a
fresh torch.Generator, so every rank computes the same permutation without communication
and a restarted job recomputes it bit for bit.

What was *consumed* is recorded by the caller through `advance(n_samples)`, never by the
sampler's own iteration: DataLoader workers pull indices `prefetch_factor * num_workers`
batches ahead of the step that trains on them, so the iteration position overstates what
was trained on. On resume the sampler skips exactly `consumed` samples of that epoch's order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from trainspeed.errors import CheckpointError, ConfigError

__all__ = ["ResumableSampler", "epoch_seed"]

_MASK63 = (1 << 63) - 1


def epoch_seed(seed: int, epoch: int, salt: int = 0) -> int:
    """Mix (seed, epoch, salt) into one 63-bit generator seed.

    `seed + epoch` (DistributedSampler's choice) makes (seed=0, epoch=1) and (seed=1, epoch=0)
    the same stream; a multiplicative mix keeps neighbouring seeds' epochs apart.
    """
    x = (int(seed) * 0x9E3779B97F4A7C15 + int(epoch) * 0xBF58476D1CE4E5B9 + int(salt) * 0x94D049BB133111EB)
    x &= _MASK63
    x ^= x >> 31
    return x & _MASK63


def check_shard(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in [0, world_size={world_size}), got {rank}")


class ResumableSampler:
    """Sampler over range(dataset_len) for DataLoader(sampler=...).

    Sharding follows DistributedSampler: without drop_last the order is padded by repeating
    its first indices so that every rank gets ceil(n / world_size) samples; with drop_last the
    tail is dropped so every rank gets floor(n / world_size). Rank r takes order[r::world_size].
    With `batch_size` and drop_last, each rank's epoch is further cut to a whole number of
    batches, so the DataLoader never forms a last partial batch and `consumed` reaches the end.
    """

    def __init__(
        self,
        dataset_len: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        batch_size: int | None = None,
    ) -> None:
        if dataset_len < 0:
            raise ConfigError(f"ResumableSampler dataset_len must be >= 0, got {dataset_len}")
        check_shard(rank, world_size)
        if batch_size is not None and batch_size < 1:
            raise ConfigError(f"ResumableSampler batch_size must be >= 1, got {batch_size}")
        self.dataset_len = int(dataset_len)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = bool(drop_last)
        self.batch_size = batch_size
        self.epoch = 0
        self.consumed = 0
        """Samples of this rank's share of `epoch` that the caller has trained on."""
        if self.drop_last:
            per_rank = self.dataset_len // self.world_size
            if batch_size is not None:
                per_rank -= per_rank % batch_size
        else:
            per_rank = math.ceil(self.dataset_len / self.world_size)
        self.num_samples = per_rank
        """Samples per rank per epoch."""

    def __len__(self) -> int:
        """Samples left in the current epoch (what the next iteration yields)."""
        return self.num_samples - self.consumed

    # ------------------------------------------------------------------ order
    def epoch_order(self, epoch: int) -> list[int]:
        """This rank's full index list for `epoch` (before skipping consumed samples)."""
        import torch

        n = self.dataset_len
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(epoch_seed(self.seed, epoch))
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        total = self.num_samples * self.world_size
        if total > len(order) and order:
            # pad by repetition (as DistributedSampler), possibly several times for tiny sets
            reps = math.ceil(total / len(order))
            order = (order * reps)[:total]
        else:
            order = order[:total]
        return order[self.rank : total : self.world_size]

    def __iter__(self) -> Iterator[int]:
        # snapshot: the trainer may advance() while workers still pull from this iterator
        order = self.epoch_order(self.epoch)
        return iter(order[self.consumed :])

    # ------------------------------------------------------------------ state
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; a different epoch starts at its beginning, the same one is kept
        (so set_epoch after load_state_dict does not lose the resume position)."""
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self.epoch, self.consumed = int(epoch), 0

    def advance(self, n_samples: int) -> None:
        """Record that the caller trained on `n_samples` more samples of this rank's share.
        Reaching the end of the epoch rolls over to the next epoch at position 0."""
        if n_samples < 0:
            raise ValueError(f"advance() needs n_samples >= 0, got {n_samples}")
        self.consumed += int(n_samples)
        if self.consumed >= self.num_samples > 0:
            self.epoch, self.consumed = self.epoch + 1, 0

    def _consumed_for_world(self, consumed: int, saved_world: int) -> int:
        """This rank's resume position when the checkpoint came from `saved_world` ranks.

        Every rank takes every world_size-th index of one shared epoch order, so after each
        of W ranks consumed c samples, exactly order[:c * W] has been trained on. A job with
        W' ranks continues at the same place when c * W is a multiple of W' (keep the global
        batch, per-rank batch x ranks, the same to continue the same optimization)."""
        if saved_world == self.world_size:
            return consumed
        done = consumed * saved_world
        if done % self.world_size:
            raise CheckpointError(
                f"sampler state was saved by {saved_world} ranks after {consumed} samples each "
                f"({done} in this epoch), which {self.world_size} ranks cannot split evenly; resume "
                f"with a number of processes that divides {done} (e.g. torchrun --nproc_per_node "
                f"{saved_world}) or from another checkpoint")
        return done // self.world_size

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "dataset_len": self.dataset_len,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, mine in (("dataset_len", self.dataset_len), ("seed", self.seed)):
            if key in state and int(state[key]) != mine:
                raise CheckpointError(
                    f"sampler state was saved with {key}={state[key]} but this run has {key}={mine}; "
                    "the sample order would differ, so the resume position is meaningless"
                )
        consumed = self._consumed_for_world(int(state["consumed"]), int(state.get("world_size", self.world_size)))
        if not 0 <= consumed <= self.num_samples:
            raise CheckpointError(
                f"sampler state consumed={consumed} is outside [0, {self.num_samples}] samples per epoch"
            )
        self.epoch, self.consumed = int(state["epoch"]), consumed
