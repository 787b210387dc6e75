"""Byte-level text that exists on every machine: the Python standard library's source files.

The corpus is tokenized once (bytes are the tokens) into a uint8 file under
`$TRAINSPEED_CACHE` (default `~/.cache/trainspeed/`), written atomically (temp file +
rename), and read back memory-mapped, so workers share the page cache instead of copies.
Item i of a `ByteWindows` dataset is the window at a fixed pseudo-random offset derived from
i alone: the sampler's order fully defines the data, which makes resume exact.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from trainspeed.recipes.cache import CACHE_ENV, cache_dir  # noqa: F401 - re-exported

FORMAT_VERSION = 1  # bump when the file layout changes, so stale caches are not reused
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list[Path]:
    """Every `*.py` under root in sorted order, skipping installed packages (they differ per machine)."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        found.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def cache_path(root: Path | None = None, directory: Path | None = None) -> Path:
    """Cache file name: keyed by Python version, corpus root and format version."""
    root = (root or stdlib_root()).resolve()
    v = sys.version_info
    key = hashlib.sha256(f"{root}|{FORMAT_VERSION}".encode()).hexdigest()[:10]
    name = f"gpt-stdlib-{sys.implementation.name}{v.major}.{v.minor}.{v.micro}-{key}.u8"
    return (directory or cache_dir()) / name


def tokenize(root: Path, out: Path) -> int:
    """Concatenate the bytes of every source file into `out` atomically; returns the byte count.

    Written to a temp file in the same directory and renamed into place only when complete,
    so an interrupted run never leaves a half-written cache that a later run would trust.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    total = 0
    try:
        with os.fdopen(fd, "wb") as fh:
            for path in source_files(root):
                data = read_source(path)
                fh.write(data)
                fh.write(b"\n")
                total += len(data) + 1
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache is shared, read-only data
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return total


def read_source(path: Path) -> bytes:
    """Raw bytes of one file (a seam for tests that interrupt tokenization)."""
    try:
        return path.read_bytes()
    except OSError:  # unreadable file (permissions, broken link): skip it
        return b""


def load_tokens(root: Path | None = None, directory: Path | None = None) -> Path:
    """Path of the cached token file, tokenizing the corpus on first use."""
    root = root or stdlib_root()
    path = cache_path(root, directory)
    if not path.exists():
        tokenize(root, path)
    return path


class ByteWindows(Dataset):
    """`num_samples` windows of block_size+1 bytes from tokens[start:end]; item i -> (x, y).

    The memory map is opened lazily in each process (a pickled dataset carries only the path),
    so DataLoader workers neither copy the corpus nor share a file handle.
    """

    def __init__(self, path: Path, start: int, end: int, block_size: int, num_samples: int, seed: int = 0):
        if end - start < block_size + 2:
            raise ValueError(
                f"corpus slice of {end - start} bytes is too short for block_size={block_size}"
            )
        self.path, self.start, self.end = Path(path), start, end
        self.block_size, self.num_samples, self.seed = block_size, num_samples, seed
        self._tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return self.num_samples

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_tokens"] = None
        return state

    def offset(self, i: int) -> int:
        """Deterministic offset of item i (splitmix64 of seed and i), uniform over the slice."""
        z = (i + 1 + self.seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        z ^= z >> 31
        return self.start + z % (self.end - self.start - self.block_size - 1)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.num_samples:
            raise IndexError(f"index {i} out of range for {self.num_samples} samples")
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=np.uint8, mode="r")
        o = self.offset(i)
        chunk = torch.from_numpy(self._tokens[o : o + self.block_size + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


def make_datasets(
    block_size: int,
    samples_per_epoch: int,
    val_samples: int,
    *,
    seed: int = 0,
    root: Path | None = None,
    directory: Path | None = None,
    val_fraction: float = 0.1,
) -> tuple[ByteWindows, ByteWindows]:
    """Train/val datasets over a 90/10 split of the corpus (val is the tail)."""
    path = load_tokens(root, directory)
    n = path.stat().st_size
    split = int(n * (1.0 - val_fraction))
    train = ByteWindows(path, 0, split, block_size, samples_per_epoch, seed=seed)
    val = ByteWindows(path, split, n, block_size, val_samples, seed=seed + 1)
    return train, val
