"""A class-structured synthetic image folder, generated once from a seed into the cache.

Each class is a shape (ellipse, box, triangle, cross, ring) in a class colour family, drawn
at a random position, size and tint on a random noisy background, then saved as JPEG/PNG at
a realistic size. The class is visible in the pixels (so the loss falls within ~100 steps)
while decoding and augmenting each file still costs real CPU time, like a photo folder.

Layout (torchvision ImageFolder): <root>/{train,val}/<class>/<index>.<ext>.
The folder is written into a temp dir next to its final place and renamed when complete:
a killed generator leaves no half folder that a later run would trust.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from trainspeed.errors import require

FORMAT_VERSION = 1  # bump when the drawing changes, so stale caches are not reused
SHAPES = ("ellipse", "box", "triangle", "cross", "ring")
# Two colour families (warm, cool); class c uses shape c % 5 and family (c // 5) % 2, and a
# per-class hue shift so classes beyond 10 still differ.
_FAMILIES = (np.array([220, 80, 40]), np.array([40, 110, 220]))


def folder_name(*, classes: int, per_class: int, val_per_class: int, size: int, fmt: str, seed: int) -> str:
    key = f"{FORMAT_VERSION}|{classes}|{per_class}|{val_per_class}|{size}|{fmt}|{seed}"
    return f"convnext-synth-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def class_colour(c: int) -> np.ndarray:
    shift = (c * 37) % 60 - 30
    return np.clip(_FAMILIES[(c // len(SHAPES)) % 2] + shift, 0, 255)


def draw(c: int, size: int, rng: np.random.Generator) -> Any:
    """One image of class c as a PIL RGB image."""
    Image = require("PIL.Image", package="pillow", extra="vision", feature="the convnext recipe")
    ImageDraw = require("PIL.ImageDraw", package="pillow", extra="vision", feature="the convnext recipe")
    bg = tuple(int(v) for v in rng.integers(60, 200, size=3))
    img = Image.new("RGB", (size, size), bg)
    d = ImageDraw.Draw(img)
    colour = tuple(int(v) for v in np.clip(class_colour(c) + rng.integers(-25, 26, size=3), 0, 255))
    r = int(size * rng.uniform(0.22, 0.38))  # large enough to survive a random resized crop
    cx, cy = (int(size * rng.uniform(0.38, 0.62)) for _ in range(2))
    shape = SHAPES[c % len(SHAPES)]
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "ellipse":
        d.ellipse(box, fill=colour)
    elif shape == "box":
        d.rectangle(box, fill=colour)
    elif shape == "triangle":
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    elif shape == "cross":
        w = max(r // 3, 2)
        d.rectangle((cx - r, cy - w, cx + r, cy + w), fill=colour)
        d.rectangle((cx - w, cy - r, cx + w, cy + r), fill=colour)
    else:  # ring
        d.ellipse(box, outline=colour, width=max(r // 3, 2))
    # one pass of noise over everything: neither background nor shape is a flat colour
    arr = np.asarray(img, dtype=np.float32) + 16.0 * rng.standard_normal((size, size, 3), dtype=np.float32)
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def write_folder(root: Path, *, classes: int, per_class: int, val_per_class: int, size: int,
                 fmt: str, seed: int) -> None:
    """Write the whole folder under `root` (which must not exist yet). Deterministic: every
    image comes from its own generator seeded by (seed, split, class, index)."""
    ext = "jpg" if fmt == "jpeg" else "png"
    save_kw = {"quality": 90} if fmt == "jpeg" else {"compress_level": 6}
    for split, count in (("train", per_class), ("val", val_per_class)):
        split_id = 0 if split == "train" else 1
        for c in range(classes):
            out = root / split / f"class_{c:02d}"
            out.mkdir(parents=True)
            for i in range(count):
                rng = np.random.Generator(np.random.PCG64([seed, split_id, c, i]))
                draw(c, size, rng).save(out / f"{i:05d}.{ext}", format=fmt.upper(), **save_kw)


def ensure_folder(directory: Path, *, classes: int = 10, per_class: int = 160, val_per_class: int = 16,
                  size: int = 128, fmt: str = "jpeg", seed: int = 0) -> Path:
    """The synthetic folder in `directory`, generated on first use (atomically)."""
    params = dict(classes=classes, per_class=per_class, val_per_class=val_per_class, size=size, fmt=fmt, seed=seed)
    final = directory / folder_name(**params)
    if final.is_dir():
        return final
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        write_folder(tmp / "data", **params)
        os.chmod(tmp / "data", 0o755)
        try:
            os.rename(tmp / "data", final)  # atomic: the folder appears complete or not at all
        except OSError:
            if not final.is_dir():  # not a concurrent generator winning the race: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
