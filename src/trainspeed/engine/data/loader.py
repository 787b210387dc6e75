"""build_dataloader: one place where DataConfig becomes a DataLoader.

Every DataLoader speed switch is applied here (workers, pinned memory, persistent workers,
prefetch depth, dynamic padding, length bucketing) together with what makes runs exact:
a resumable sampler and per-epoch worker seeds.

Resume: the trainer calls `bundle.advance(samples)` after each trained batch and saves
`bundle.state_dict()`; a rebuilt bundle given `load_state_dict(state)` yields exactly the
batches that were not trained yet. (Augmentation randomness inside workers restarts from
the epoch's worker seed, so a resumed epoch's augmentations differ from an uninterrupted one.)
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainspeed.engine.data.bucketing import LengthBucketBatchSampler
from trainspeed.engine.data.collate import PadCollate
from trainspeed.engine.data.samplers import ResumableSampler, epoch_seed

__all__ = ["build_dataloader", "LoaderBundle", "seed_worker", "resolve_pin_memory"]


def seed_worker(worker_id: int) -> None:
    """worker_init_fn: seed Python's and NumPy's global RNGs from the worker's torch seed.

    DataLoader seeds torch in each worker with base_seed + worker_id, where base_seed is drawn
    from the loader's `generator`; deriving the other RNGs from it makes augmentation code
    that uses `random` or `np.random` reproducible too (and different per worker).
    """
    import torch

    s = torch.initial_seed() % 2**32
    random.seed(s)
    np.random.seed(s)


def init_worker(worker_id: int) -> None:
    """worker_init_fn: `seed_worker`, and a SIGTERM that the parent did not send ignored.

    PyTorch's workers die of a SIGTERM that their parent did not send (its handler re-raises
    it), and the parent's SIGCHLD handler then raises 'DataLoader worker (pid N) is killed by
    signal: Terminated' in the middle of a step. A SIGTERM sent to the process group (`kill --
    -PGID`, a scheduler that signals every process of the job) thus ended `trainspeed train
    gpt data.num_workers=2` as a crash with a traceback and exit 1, where the same signal to the
    main process alone saves at the step boundary and exits 143. The main process decides how
    to stop; the loader's own shutdown (the parent's SIGTERM) still ends a worker at once, as
    PyTorch's handler does, and a worker left without its parent ends itself (PyTorch's
    watchdog). Ignoring SIGTERM outright would not do: the parent's terminate() at exit was
    ignored too, and multiprocessing's exit handler waited for the worker forever.
    """
    seed_worker(worker_id)
    _parent_sigterm_only()


def _parent_sigterm_only() -> None:
    import os
    import signal
    import threading

    if not hasattr(signal, "sigwaitinfo"):  # pragma: no cover - not Linux
        return
    parent = os.getppid()
    try:  # blocked in this thread and in every thread it starts (the queue's feeder)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    except (ValueError, OSError):  # pragma: no cover
        return

    def wait() -> None:
        while True:
            info = signal.sigwaitinfo({signal.SIGTERM})
            if info.si_pid == parent or os.getppid() != parent:
                os._exit(0)  # the loader's shutdown, or no parent left: PyTorch's worker does the same

    threading.Thread(target=wait, name="trainspeed-worker-sigterm", daemon=True).start()


def resolve_pin_memory(setting: Any, device: Any, cuda_available: bool) -> tuple[bool, str | None]:
    """(pin or not, note). 'auto' pins only for a CUDA device; True without CUDA is a note."""
    import torch

    is_cuda = torch.device(device).type == "cuda"
    if setting == "auto":
        return bool(cuda_available and is_cuda), None
    if setting and not cuda_available:
        return False, "data.pin_memory=true has no effect without CUDA (page-locked memory only speeds up host-to-GPU copies); not pinning"
    return bool(setting), None


def _make_loader_class() -> type:
    from torch.utils.data import DataLoader

    class EpochSeededDataLoader(DataLoader):
        """DataLoader whose worker base seed is re-derived from (seed, epoch, rank) each time
        an iterator is created, so worker randomness depends on the epoch, not on how many
        iterators were created before (which differs after a resume)."""

        ts_reseed: Callable[[], None] | None = None

        def __iter__(self):  # type: ignore[override]
            if self.ts_reseed is not None:
                self.ts_reseed()
            return super().__iter__()

    return EpochSeededDataLoader


@dataclass(kw_only=True, slots=True)
class LoaderBundle:
    """A DataLoader together with the objects that resume and describe it."""

    loader: Any
    """The torch.utils.data.DataLoader to iterate."""
    sampler: ResumableSampler | LengthBucketBatchSampler
    """Resumable order: ResumableSampler (counts samples) or LengthBucketBatchSampler (batches)."""
    collate: Callable | None
    """The collate function in use (None: PyTorch's default_collate)."""
    generator: Any
    """torch.Generator that seeds the workers, re-seeded per epoch."""
    seed: int
    """Run seed the orders and worker seeds derive from."""
    rank: int = 0
    """This process's rank."""
    notes: list[str] = field(default_factory=list)
    """Human-readable notes about settings that were ignored or adjusted."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The effective loader settings (for telemetry and the doctor)."""

    @property
    def bucketed(self) -> bool:
        return isinstance(self.sampler, LengthBucketBatchSampler)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def __len__(self) -> int:
        """Batches left in the current epoch."""
        return len(self.loader)

    def reseed_workers(self) -> None:
        self.generator.manual_seed(epoch_seed(self.seed, self.sampler.epoch, salt=1000 + self.rank))

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def advance(self, samples: int, *, batches: int = 1) -> None:
        """Record that `batches` batches holding `samples` samples were trained on."""
        self.sampler.advance(batches if self.bucketed else samples)

    def advancer(self) -> tuple[Callable[[int], None], bool]:
        """(the sampler's advance, whether it counts batches): for a loop that calls it every
        step and picks the unit itself, with no adapter frame in between. A bucketed sampler
        counts batches (its batches are its unit of order), a plain one samples."""
        return self.sampler.advance, self.bucketed

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "bucket" if self.bucketed else "sample", **self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from trainspeed.errors import CheckpointError

        kind = "bucket" if self.bucketed else "sample"
        if state.get("kind", kind) != kind:
            raise CheckpointError(
                f"data loader state was saved with {'bucketing' if state['kind'] == 'bucket' else 'no bucketing'}"
                f" but this run uses {'bucketing' if self.bucketed else 'no bucketing'}; "
                "set data.bucketing as in the saved run to resume exactly"
            )
        self.sampler.load_state_dict({k: v for k, v in state.items() if k != "kind"})


def _resolve_collate(cfg: Any, collate_fn: Callable | None, lengths: Any, notes: list[str]) -> tuple[Callable | None, str | None]:
    """The collate_fn to use and its pad mode ('longest'/'max', None when not padding)."""
    dynamic = bool(cfg.dynamic_padding) or bool(cfg.bucketing and lengths is not None)
    if cfg.bucketing and not cfg.dynamic_padding and lengths is not None:
        notes.append("data.bucketing pads each batch to its longest sample (dynamic padding); padding to max_seq_len would undo it")
    if collate_fn is None and lengths is None:
        if cfg.dynamic_padding:
            notes.append("data.dynamic_padding has no effect: this dataset has no sequence lengths and no PadCollate")
        return None, None
    base = collate_fn if collate_fn is not None else PadCollate()
    if not isinstance(base, PadCollate):
        if cfg.dynamic_padding or cfg.bucketing:
            notes.append(f"custom collate_fn {getattr(base, '__name__', type(base).__name__)} decides padding itself")
        return base, None
    max_len = cfg.max_seq_len if cfg.max_seq_len is not None else base.max_seq_len
    pad_to = "longest" if dynamic or max_len is None else "max"
    if not dynamic and max_len is None:
        notes.append("data.dynamic_padding=false but no max_seq_len is known: padding to the longest sample")
    collate = dataclasses.replace(base, pad_id=cfg.pad_id, max_seq_len=max_len, pad_to=pad_to)
    return collate, pad_to


def build_dataloader(
    dataset: Any,
    cfg: Any,
    *,
    collate_fn: Callable | None = None,
    lengths: Sequence[int] | np.ndarray | None = None,
    device: Any = "cpu",
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    train: bool = True,
) -> LoaderBundle:
    """Build the DataLoader for `dataset` from a DataConfig (or any object with its fields).

    collate_fn: None -> PadCollate when `lengths` is given (sequence data), else PyTorch's
    default; a PadCollate -> its structure (keys, labels) is kept and its padding is set
    from cfg (pad_id, max_seq_len, dynamic padding); any other callable is used as is.
    lengths: per-sample sequence lengths; needed for bucketing (cfg.bucketing).
    train=False: no shuffling, no dropped samples (evaluation).
    """
    import torch

    notes: list[str] = []
    shuffle = bool(cfg.shuffle) and train
    drop_last = bool(cfg.drop_last) and train
    collate, pad_to = _resolve_collate(cfg, collate_fn, lengths, notes)

    pin, pin_note = resolve_pin_memory(cfg.pin_memory, device, torch.cuda.is_available())
    if pin_note:
        notes.append(pin_note)
    workers = int(cfg.num_workers)
    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs["persistent_workers"] = bool(cfg.persistent_workers)
        if cfg.prefetch_factor is not None:
            kwargs["prefetch_factor"] = int(cfg.prefetch_factor)
    else:
        if cfg.persistent_workers:
            notes.append("data.persistent_workers ignored: it needs data.num_workers > 0")
        if cfg.prefetch_factor is not None:
            notes.append("data.prefetch_factor ignored: it needs data.num_workers > 0")

    generator = torch.Generator()
    use_buckets = bool(cfg.bucketing) and lengths is not None
    if cfg.bucketing and lengths is None:
        notes.append("data.bucketing ignored: the dataset provides no per-sample lengths")
    sampler: ResumableSampler | LengthBucketBatchSampler
    if use_buckets:
        lens = np.asarray(lengths, dtype=np.int64)
        if len(lens) != len(dataset):
            from trainspeed.errors import ConfigError

            raise ConfigError(f"bucketing got {len(lens)} lengths for a dataset of {len(dataset)} samples")
        max_len = getattr(collate, "max_seq_len", None) or cfg.max_seq_len
        if max_len is not None:
            lens = np.minimum(lens, max_len)  # the collate truncates, so bucket by truncated length
        sampler = LengthBucketBatchSampler(
            lens,
            max_tokens=cfg.bucket_max_tokens,
            batch_size=cfg.batch_size,
            num_buckets=cfg.bucket_num_buckets,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
        )
        notes.extend(sampler.notes)
        loader_args: dict[str, Any] = {"batch_sampler": sampler}
    else:
        sampler = ResumableSampler(
            len(dataset),
            shuffle=shuffle,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            batch_size=int(cfg.batch_size) if drop_last else None,
        )
        loader_args = {"sampler": sampler, "batch_size": int(cfg.batch_size), "drop_last": drop_last}

    loader = _make_loader_class()(
        dataset,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin,
        worker_init_fn=init_worker if workers > 0 else None,
        generator=generator,
        **loader_args,
        **kwargs,
    )
    bundle = LoaderBundle(
        loader=loader,
        sampler=sampler,
        collate=collate,
        generator=generator,
        seed=int(seed),
        rank=int(rank),
        notes=notes,
        settings={
            "num_workers": workers,
            "pin_memory": pin,
            "persistent_workers": kwargs.get("persistent_workers", False),
            "prefetch_factor": kwargs.get("prefetch_factor"),
            "pad_to": pad_to,
            "bucketing": use_buckets,
            "shuffle": shuffle,
            "drop_last": drop_last,
        },
    )
    loader.ts_reseed = bundle.reseed_workers
    bundle.reseed_workers()
    return bundle
