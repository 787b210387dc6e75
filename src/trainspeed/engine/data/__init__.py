"""The engine's data pipeline: collate, resumable samplers, length bucketing, loader builder,
device prefetch. Import-light: torch is imported inside functions where possible."""

from __future__ import annotations

from trainspeed.engine.data.bucketing import LengthBucketBatchSampler, padded_tokens, plan_batches
from trainspeed.engine.data.collate import IGNORE_INDEX, PadCollate
from trainspeed.engine.data.loader import LoaderBundle, build_dataloader, resolve_pin_memory, seed_worker
from trainspeed.engine.data.prefetch import CudaStreamBackend, DevicePrefetcher, StreamBackend, map_tensors, move_to_device
from trainspeed.engine.data.samplers import ResumableSampler, epoch_seed
from trainspeed.engine.data.stats import BatchStats, batch_stats, pad_share

__all__ = [
    "BatchStats",
    "CudaStreamBackend",
    "DevicePrefetcher",
    "IGNORE_INDEX",
    "LengthBucketBatchSampler",
    "LoaderBundle",
    "PadCollate",
    "ResumableSampler",
    "StreamBackend",
    "batch_stats",
    "build_dataloader",
    "epoch_seed",
    "map_tensors",
    "move_to_device",
    "pad_share",
    "padded_tokens",
    "plan_batches",
    "resolve_pin_memory",
    "seed_worker",
]
