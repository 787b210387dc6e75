"""Length bucketing: batch samples of similar length so batches need little padding.

Per epoch (all of it a pure function of seed, epoch and the lengths, so every rank builds
the same plan and a restarted job rebuilds it exactly):
  1. sort indices by length (ties broken by a seeded shuffle) and cut the sorted order into
     `num_buckets` equal-count buckets, i.e. at length quantiles;
  2. shuffle inside each bucket and cut it greedily into batches: at most `batch_size`
     samples and, with `max_tokens`, at most max_tokens padded tokens
     (batch size x longest sample in the batch);
  3. shuffle the order of all batches, so training does not see short-then-long epochs;
  4. make the batch count divisible by world_size (split the largest batches in two, or with
     drop_last drop trailing batches) and give rank r batches r, r + world, ...

`plan_batches` is the pure part (numpy in, lists out); the sampler class is glue.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from trainspeed.engine.data.samplers import check_shard, epoch_seed
from trainspeed.errors import CheckpointError, ConfigError

__all__ = ["LengthBucketBatchSampler", "plan_batches", "padded_tokens"]


def padded_tokens(batches: Sequence[Sequence[int]], lengths: Sequence[int] | np.ndarray) -> tuple[int, int]:
    """(real tokens, pad tokens) when each batch is padded to its own longest sample."""
    lens = np.asarray(lengths, dtype=np.int64)
    real = pad = 0
    for b in batches:
        bl = lens[np.asarray(b, dtype=np.int64)]
        real += int(bl.sum())
        pad += int(bl.max() * len(bl) - bl.sum()) if len(bl) else 0
    return real, pad


def _is_full(n: int, longest: int, batch_size: int | None, max_tokens: int | None) -> bool:
    """Whether a batch could not take one more sample of its own longest length."""
    if batch_size is not None and n >= batch_size:
        return True
    return max_tokens is not None and (n + 1) * longest > max_tokens


def plan_batches(
    lengths: np.ndarray,
    *,
    epoch: int,
    seed: int,
    max_tokens: int | None,
    batch_size: int | None,
    num_buckets: int,
    shuffle: bool,
    drop_last: bool,
    world_size: int,
) -> list[list[int]]:
    """All batches of one epoch (before sharding across ranks), as lists of sample indices."""
    n = len(lengths)
    rng = np.random.Generator(np.random.PCG64(epoch_seed(seed, epoch, salt=1)))
    # 1. quantile buckets; the random pre-permutation breaks length ties differently per epoch
    pre = rng.permutation(n) if shuffle else np.arange(n)
    order = pre[np.argsort(lengths[pre], kind="stable")]
    buckets = [b for b in np.array_split(order, min(num_buckets, max(n, 1))) if len(b)]
    batches: list[list[int]] = []
    for bucket in buckets:
        # 2. greedy packing in random order; sorting inside the bucket would pack tighter but
        #    give the same batch compositions every epoch
        members = rng.permutation(bucket) if shuffle else bucket
        cur: list[int] = []
        longest = 0
        for idx in members.tolist():
            ln = int(lengths[idx])
            new_longest = max(longest, ln)
            over_budget = max_tokens is not None and (len(cur) + 1) * new_longest > max_tokens
            over_size = batch_size is not None and len(cur) >= batch_size
            if cur and (over_budget or over_size):
                batches.append(cur)
                cur, new_longest = [], ln
            cur.append(idx)
            longest = new_longest
        if cur and not (drop_last and not _is_full(len(cur), longest, batch_size, max_tokens)):
            batches.append(cur)
    # 3. shuffle batch order
    if shuffle:
        perm = rng.permutation(len(batches))
        batches = [batches[i] for i in perm]
    # 4. equal batch count per rank
    extra = len(batches) % world_size
    if extra:
        if drop_last:
            batches = batches[: len(batches) - extra]
        else:
            batches = _split_largest(batches, world_size - extra, lengths)
    return batches


def _split_largest(batches: list[list[int]], n_splits: int, lengths: np.ndarray) -> list[list[int]]:
    """Split the `n_splits` largest batches in two, keeping every sample exactly once.
    Falls back to repeating the first batches when too few batches have 2+ samples."""
    out = list(batches)
    for _ in range(n_splits):
        j = max(range(len(out)), key=lambda k: len(out[k]), default=None)
        if j is None or len(out[j]) < 2:
            out.append(list(out[len(out) % max(len(batches), 1)]) if batches else [])
            continue
        b = sorted(out[j], key=lambda i: int(lengths[i]))  # halves of similar length pad less
        half = len(b) // 2
        out[j : j + 1] = [b[:half], b[half:]]
    return out


class LengthBucketBatchSampler:
    """Batch sampler for DataLoader(batch_sampler=...): yields lists of indices.

    Every sample appears exactly once per epoch across all ranks (drop_last drops the
    incomplete last batch of each bucket and up to world_size-1 batches). Resume: the caller
    records trained batches with `advance(n_batches)`; `state_dict()` saves (epoch, consumed
    batches) and a rebuilt sampler continues with the identical remaining batches.
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        *,
        max_tokens: int | None = None,
        batch_size: int | None = None,
        num_buckets: int = 8,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        lens = np.asarray(lengths, dtype=np.int64)
        if lens.ndim != 1:
            raise ConfigError(f"bucketing lengths must be a flat sequence of ints, got shape {lens.shape}")
        if len(lens) and lens.min() < 0:
            raise ConfigError(f"bucketing lengths must be >= 0, got min {lens.min()}")
        if max_tokens is None and batch_size is None:
            raise ConfigError("LengthBucketBatchSampler needs max_tokens, batch_size or both")
        if max_tokens is not None and max_tokens < 1:
            raise ConfigError(f"data.bucket_max_tokens must be >= 1, got {max_tokens}")
        if batch_size is not None and batch_size < 1:
            raise ConfigError(f"data.batch_size must be >= 1, got {batch_size}")
        if num_buckets < 1:
            raise ConfigError(f"data.bucket_num_buckets must be >= 1, got {num_buckets}")
        check_shard(rank, world_size)
        self.lengths = lens
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.num_buckets = int(num_buckets)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.epoch = 0
        self.consumed = 0
        """Batches of this rank's share of `epoch` the caller has trained on."""
        self._plan: tuple[int, list[list[int]]] | None = None
        n_over = int((lens > max_tokens).sum()) if max_tokens is not None else 0
        self.notes: list[str] = []
        if n_over:
            self.notes.append(
                f"{n_over} samples are longer than bucket_max_tokens={max_tokens}; each forms a "
                "batch of its own that exceeds the budget (truncate with data.max_seq_len)"
            )

    # ------------------------------------------------------------------ plan
    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches for `epoch` (before skipping consumed batches); cached."""
        if self._plan is None or self._plan[0] != epoch:
            all_batches = plan_batches(
                self.lengths,
                epoch=epoch,
                seed=self.seed,
                max_tokens=self.max_tokens,
                batch_size=self.batch_size,
                num_buckets=self.num_buckets,
                shuffle=self.shuffle,
                drop_last=self.drop_last,
                world_size=self.world_size,
            )
            self._plan = (epoch, all_batches[self.rank :: self.world_size])
        return self._plan[1]

    def num_batches(self, epoch: int | None = None) -> int:
        """Batches per rank in `epoch` (the current one by default); varies with the epoch
        under a token budget, because packing depends on the shuffled order."""
        return len(self.epoch_batches(self.epoch if epoch is None else epoch))

    def __len__(self) -> int:
        """Batches left in the current epoch (what the next iteration yields)."""
        return self.num_batches() - self.consumed

    def __iter__(self) -> Iterator[list[int]]:
        # snapshot of the remaining batches: advance() may run while workers still pull
        batches = self.epoch_batches(self.epoch)[self.consumed :]
        return iter([list(b) for b in batches])

    # ------------------------------------------------------------------ state
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; a different epoch starts at its beginning, the same one is kept."""
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self.epoch, self.consumed = int(epoch), 0

    def advance(self, n_batches: int = 1) -> None:
        """Record that the caller trained on `n_batches` more batches; the end of the epoch
        rolls over to the next epoch at position 0."""
        if n_batches < 0:
            raise ValueError(f"advance() needs n_batches >= 0, got {n_batches}")
        self.consumed += int(n_batches)
        total = self.num_batches()
        if self.consumed >= total > 0:
            self.epoch, self.consumed = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "dataset_len": int(len(self.lengths)),
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = {"seed": self.seed, "dataset_len": int(len(self.lengths)), "world_size": self.world_size}
        if "world_size" in state and int(state["world_size"]) != self.world_size:
            raise CheckpointError(
                f"bucket sampler state was saved with world_size={state['world_size']} but this run "
                f"has world_size={self.world_size}; the length-bucketed batch plan depends on the number of ranks, "
                f"so resume with torchrun --nproc_per_node {state['world_size']} (or without "
                "data.bucketing, whose sample order does not depend on it)")
        for key, value in mine.items():
            if key in state and int(state[key]) != value:
                raise CheckpointError(
                    f"bucket sampler state was saved with {key}={state[key]} but this run has "
                    f"{key}={value}; the batch plan would differ, so the resume position is meaningless"
                )
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        total = self.num_batches(epoch)
        if not 0 <= consumed <= total:
            raise CheckpointError(f"bucket sampler state consumed={consumed} is outside [0, {total}] batches")
        self.epoch, self.consumed = epoch, consumed
