"""Which training framework drives the script: PyTorch Lightning, the Hugging Face Trainer,
Accelerate, DeepSpeed's engine, or a plain loop. Read from the call stack at the first optimizer step, so a
framework that is merely imported does not count."""

from __future__ import annotations

import sys

# (name, path fragment) in priority order: the outermost framework frame wins.
_MARKERS: tuple[tuple[str, str], ...] = (
    ("lightning", "/lightning/pytorch/"),
    ("lightning", "/pytorch_lightning/"),
    ("lightning_fabric", "/lightning/fabric/"),
    ("hf_trainer", "/transformers/trainer"),
    ("accelerate", "/accelerate/"),
    ("deepspeed", "/deepspeed/runtime/"),
)


def detect_from_stack(max_depth: int = 200) -> str:
    """"lightning", "hf_trainer", "accelerate", "lightning_fabric", "deepspeed" or "plain"."""
    found: set[str] = set()
    frame = sys._getframe(1)
    depth = 0
    while frame is not None and depth < max_depth:
        filename = frame.f_code.co_filename.replace("\\", "/")
        for name, marker in _MARKERS:
            if marker in filename:
                found.add(name)
        frame = frame.f_back
        depth += 1
    for name, _ in _MARKERS:
        if name in found:
            return name
    return "plain"
