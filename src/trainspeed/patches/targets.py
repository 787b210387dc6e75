"""Where in a user's script a setting applies: what the doctor's probe run saw.

A setting such as `loader.num_workers=4` must change the training loop's DataLoader and no
other; `precision=bf16` wraps the forward of the module the loss comes from. The doctor records
the call sites (file, line) of those objects' construction and use; the script tuner passes
them to every trial, to `trainspeed run --with`, and to the code-change writer, as `Targets`.
Every field is optional: a patch without its target falls back to a documented rule (all
DataLoaders created in the user's own files; the first trained module) and says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

Site = tuple[str, int]
"""(absolute filename, 1-based line number) of a call in the user's code."""


@dataclass(kw_only=True, slots=True)
class Targets:
    script: str | None = None
    """Absolute path of the script (or the module's file) the command runs."""
    loader_site: Site | None = None
    """Where the training DataLoader (the one the step consumes) is constructed: `DataLoader(`."""
    optimizer_site: Site | None = None
    """Where the primary optimizer (the one whose step closes a training step) is constructed."""
    optimizer_class: str | None = None
    """Its class name (AdamW, SGD, ...)."""
    optimizer_sites: tuple[Site, ...] = ()
    """Where every optimizer that steps in the loop is built, the primary's first (a GAN's
    discriminator's and generator's): fused/foreach goes to each, as the trials measured it."""
    optimizer_build_sites: tuple[Site, ...] = ()
    """With several optimizers, each one's construction site (one per optimizer, a site twice
    when two are built on one line: `optimizers = [SGD(...), AdamW(...)]`), the primary's first;
    `optimizer_build_classes` holds their classes in the same order. best.patch gives each call
    the kernel it takes (only the first of that line's was, while the trials set both)."""
    optimizer_build_classes: tuple[str, ...] = ()
    model_class: str | None = None
    """Class name of the trained module (the outermost module called with grad in train mode)."""
    model_call_site: Site | None = None
    """Where the training loop calls that module (`out = model(x)`): autocast goes around it."""
    trained_classes: tuple[str, ...] = ()
    """Class names of every module an optimizer trains (a GAN's generator and discriminator),
    the trained module's first. Mixed precision covers them all: one model's bf16 output is the
    next one's input."""
    from_pretrained_site: Site | None = None
    """Where a Hugging Face model is loaded (`AutoModel...from_pretrained(` / `from_config(`)."""
    autocast: str | None = None
    """The autocast dtype the script already uses around its forward ("bfloat16"), or None."""
    compiled: bool = False
    """The script already compiles its model."""
    convolutional: bool = False
    """The trained module has Conv2d layers (channels_last applies)."""
    hf_model: bool = False
    """The trained module is a transformers PreTrainedModel."""
    save_sites: tuple[Site, ...] = ()
    """The script's own `torch.save` calls made during the steps (whatif_code.py edits them)."""
    log_sites: tuple[Site, ...] = ()
    """Its logging calls (print, SummaryWriter.add_*, wandb.log) made during the steps."""
    gc_sites: tuple[Site, ...] = ()
    """Its gc.collect / torch.cuda.empty_cache calls made during the steps."""
    framework: str | None = None
    """The loop's framework as the doctor saw it ("lightning", "lightning_fabric",
    "transformers"), or None for a plain loop: precision then belongs in its constructor."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: ([list(x) for x in v] if k.endswith("_sites") else list(v) if isinstance(v, tuple) else v)
                for k, v in d.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Targets":
        data = data or {}
        known = {f.name for f in fields(cls)}
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                continue  # a newer writer's field: ignored, not an error
            if key.endswith("_site") and value is not None:
                value = (str(value[0]), int(value[1]))
            elif key.endswith("_sites"):
                value = tuple((str(v[0]), int(v[1])) for v in value or ())
            elif key.endswith("_classes"):
                value = tuple(str(v) for v in value or ())
            out[key] = value
        return cls(**out)


__all__ = ["Site", "Targets"]
