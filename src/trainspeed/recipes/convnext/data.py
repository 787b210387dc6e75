"""ImageFolder data decoded with Pillow and augmented on the CPU, the way image training
usually loads: per sample, open and decode a file, random resized crop, horizontal flip,
normalize. That per-sample work is the point: it is what DataLoader workers exist for.

Randomness comes from Python's `random` module, which the engine seeds in the main process
(run.seed) and in each worker (`seed_worker`), so augmentations are reproducible.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from trainspeed.errors import ConfigError, require

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm", ".tif", ".tiff")
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)  # ImageNet statistics
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def _pil():
    return require("PIL.Image", package="pillow", extra="vision", feature="the convnext recipe")


def class_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())


def scan(root: Path, key: str = "recipe.options.data_path") -> tuple[list[str], list[tuple[str, int]], list[tuple[str, int]] | None]:
    """(classes, train samples, val samples or None) of an ImageFolder.

    `root/train` + `root/val` are used as given; otherwise the class folders are directly in
    root and the caller splits them. Bad layouts raise ConfigError saying what was found.
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ConfigError(f"{key}={str(root)!r} is not a directory; give an ImageFolder "
                          "(one subfolder of images per class, or train/ and val/ holding such subfolders)")
    split = (root / "train").is_dir() and (root / "val").is_dir()
    train_root = root / "train" if split else root
    classes = [p.name for p in class_dirs(train_root)]
    if len(classes) < 2:
        raise ConfigError(f"{key}={str(root)!r} has {len(classes)} class folder(s) in {str(train_root)!r}; "
                          "a classifier needs at least 2 (one subfolder of images per class)")

    def samples(base: Path) -> list[tuple[str, int]]:
        out = []
        for idx, name in enumerate(classes):
            out += [(str(p), idx) for p in images_in(base / name)] if (base / name).is_dir() else []
        return out

    train = samples(train_root)
    if not train:
        raise ConfigError(f"{key}={str(root)!r}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in its class folders")
    return classes, train, samples(root / "val") if split else None


def split_samples(samples: list[tuple[str, int]], val_fraction: float, seed: int) -> tuple[list, list]:
    """Hold out val_fraction of each class (at least one image) with a seeded shuffle."""
    rng = random.Random(seed)
    train, val = [], []
    for label in sorted({s[1] for s in samples}):
        items = [s for s in samples if s[1] == label]
        rng.shuffle(items)
        n_val = max(1, int(round(len(items) * val_fraction))) if len(items) > 1 else 0
        val += items[:n_val]
        train += items[n_val:]
    return sorted(train), sorted(val)


def to_tensor(img) -> torch.Tensor:
    """uint8 RGB PIL image -> normalized float32 CHW tensor."""
    arr = np.asarray(img, dtype=np.float32) * (1.0 / 255.0)
    arr = (arr - MEAN) / STD
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))


@dataclass(slots=True)
class TrainTransform:
    """RandomResizedCrop(size, scale=(scale_min, 1), ratio=(3/4, 4/3)) + horizontal flip +
    normalize (torchvision's algorithm: 10 tries to sample a crop, then a centre crop)."""

    size: int
    scale_min: float = 0.35

    def crop_box(self, width: int, height: int) -> tuple[int, int, int, int]:
        area = width * height
        log_ratio = (math.log(3 / 4), math.log(4 / 3))
        for _ in range(10):
            target = area * random.uniform(self.scale_min, 1.0)
            ratio = math.exp(random.uniform(*log_ratio))
            w = int(round(math.sqrt(target * ratio)))
            h = int(round(math.sqrt(target / ratio)))
            if 0 < w <= width and 0 < h <= height:
                left = random.randint(0, width - w)
                top = random.randint(0, height - h)
                return left, top, left + w, top + h
        side = min(width, height)
        left, top = (width - side) // 2, (height - side) // 2
        return left, top, left + side, top + side

    def __call__(self, img) -> torch.Tensor:
        Image = _pil()
        img = img.resize((self.size, self.size), Image.BILINEAR, box=self.crop_box(*img.size))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return to_tensor(img)


@dataclass(slots=True)
class EvalTransform:
    """Centre crop of crop_fraction of the shorter side, resized to size, normalized."""

    size: int
    crop_fraction: float = 0.875

    def __call__(self, img) -> torch.Tensor:
        Image = _pil()
        w, h = img.size
        side = min(w, h) * self.crop_fraction
        left, top = (w - side) / 2, (h - side) / 2
        return to_tensor(img.resize((self.size, self.size), Image.BILINEAR, box=(left, top, left + side, top + side)))


class ImageFolderDataset(Dataset):
    """(path, label) samples decoded on access: item i -> (image CHW float32, label int64)."""

    def __init__(self, samples: list[tuple[str, int]], classes: list[str], transform):
        self.samples, self.classes, self.transform = list(samples), list(classes), transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        path, label = self.samples[i]
        with _pil().open(path) as img:  # decoding happens here: real per-sample CPU work
            image = self.transform(img.convert("RGB"))
        return image, torch.tensor(label, dtype=torch.int64)


def make_datasets(root: Path, image_size: int, *, crop_scale_min: float, val_fraction: float,
                  seed: int = 0, key: str = "recipe.options.data_path") -> tuple[ImageFolderDataset, ImageFolderDataset]:
    classes, train, val = scan(root, key)
    if val is None:
        train, val = split_samples(train, val_fraction, seed)
    return (ImageFolderDataset(train, classes, TrainTransform(image_size, crop_scale_min)),
            ImageFolderDataset(val, classes, EvalTransform(image_size)))
