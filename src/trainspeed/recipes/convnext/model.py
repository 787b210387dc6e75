"""A small ConvNeXt (Liu et al. 2022, "A ConvNet for the 2020s") and its options dataclass.

Each block: 7x7 depthwise conv -> LayerNorm -> Linear 4x (pointwise) -> GELU -> Linear back
-> layer scale -> stochastic depth -> residual. Stages are joined by LayerNorm + 2x2 stride-2
convs; a 4x4 stride-4 "patchify" stem starts the network and global average pooling +
LayerNorm + Linear ends it. Same design as the paper, sized for a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from trainspeed.config_io import check_fields
from trainspeed.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class ConvNeXtOptions:
    """`recipe.options` of the convnext recipe (model shape, images, synthetic data)."""

    _prefix: ClassVar[str] = "recipe.options."
    depths: list[int] = field(default_factory=lambda: [1, 1, 2, 1])
    """Blocks per stage (ConvNeXt-T is [3, 3, 9, 3])."""
    dims: list[int] = field(default_factory=lambda: [24, 48, 96, 192])
    """Channels per stage (ConvNeXt-T is [96, 192, 384, 768]); same length as depths."""
    drop_path: float = 0.1
    """Stochastic depth: the last block's drop probability (rises linearly from 0)."""
    layer_scale_init: float = 1e-6
    """Initial value of the per-channel layer scale (0 disables layer scale)."""
    image_size: int = 32
    """Side of the square crops the model sees (a multiple of the network's stride, 32 with 4
    stages). Small on purpose: the CPU step stays short, so decoding is a visible share."""
    crop_scale_min: float = 0.35
    """Random resized crop: smallest crop area as a fraction of the image."""
    data_path: str | None = None
    """Your own ImageFolder (class-named subfolders of images, or train/ and val/ each holding
    them); null: a synthetic folder generated on first use in the cache."""
    val_fraction: float = 0.1
    """Share of each class held out for validation when data_path has no val/ folder."""
    synth_classes: int = 10
    """Synthetic data: number of classes."""
    synth_per_class: int = 160
    """Synthetic data: training images per class."""
    synth_val_per_class: int = 16
    """Synthetic data: validation images per class."""
    synth_image_size: int = 160
    """Synthetic data: side of the generated images in pixels."""
    synth_format: Literal["jpeg", "png"] = "jpeg"
    """Synthetic data: file format (both cost real decode time; PNG more)."""
    synth_seed: int = 0
    """Synthetic data: generator seed (the folder is cached per seed and size)."""

    def __post_init__(self) -> None:
        p = self._prefix
        check_fields(self, p)
        if not self.depths or len(self.depths) != len(self.dims):
            raise ConfigError(f"{p}depths and {p}dims must be non-empty lists of equal length, "
                              f"got depths={self.depths}, dims={self.dims}")
        if min(self.depths) < 1 or min(self.dims) < 1:
            raise ConfigError(f"{p}depths and {p}dims must hold values >= 1, got depths={self.depths}, dims={self.dims}")
        stride = 4 * 2 ** (len(self.depths) - 1)
        if self.image_size < stride or self.image_size % stride:
            raise ConfigError(f"{p}image_size must be a positive multiple of {stride} (the network's "
                              f"total stride with {len(self.depths)} stages), got {self.image_size}")
        if not 0.0 <= self.drop_path < 1.0:
            raise ConfigError(f"{p}drop_path must be in [0, 1), got {self.drop_path}")
        if self.layer_scale_init < 0:
            raise ConfigError(f"{p}layer_scale_init must be >= 0, got {self.layer_scale_init}")
        if not 0.05 <= self.crop_scale_min <= 1.0:
            raise ConfigError(f"{p}crop_scale_min must be in [0.05, 1], got {self.crop_scale_min}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"{p}val_fraction must be in (0, 1), got {self.val_fraction}")
        for name in ("synth_classes", "synth_per_class", "synth_val_per_class"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{p}{name} must be >= 1, got {getattr(self, name)}")
        if self.synth_classes < 2:
            raise ConfigError(f"{p}synth_classes must be >= 2 (a classifier needs two classes), got {self.synth_classes}")
        if not 32 <= self.synth_image_size <= 1024:
            raise ConfigError(f"{p}synth_image_size must be in [32, 1024], got {self.synth_image_size}")
        if self.synth_seed < 0:
            raise ConfigError(f"{p}synth_seed must be >= 0, got {self.synth_seed}")


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (the stem and downsampling layers)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth: zero the residual branch of whole samples with probability p and
    scale survivors by 1/(1-p), so the expected output is unchanged."""
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
    return x * mask / keep


def depthwise_kernel(side: int, kernel: int = 7) -> int:
    """The depthwise kernel for a side x side feature map: 7 (the paper's), clamped to 2*side-1.

    With zero padding of kernel//2, a tap further than side-1 pixels from the centre only ever
    multiplies padding, so it never changes the output and never gets a gradient. At 32-pixel
    inputs the last stages' maps are 2x2 and 1x1 (the paper's smallest is 7x7 at 224 pixels):
    there 7x7 kernels are 40 of 49 dead taps, and PyTorch's CPU backward for them took half of
    the training step (profiled, 1 thread: convolution_backward 17 of 34 ms). The clamped
    kernel is the full kernel's live centre: same function, same gradients.
    """
    return max(1, min(kernel, 2 * side - 1))


class Block(nn.Module):
    """ConvNeXt block (the unit to name in `activation_checkpointing: [Block]`)."""

    def __init__(self, dim: int, drop_prob: float, layer_scale_init: float, kernel_size: int = 7):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=kernel_size, padding=kernel_size // 2, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), layer_scale_init)) if layer_scale_init > 0 else None
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)  # NCHW -> NHWC: LayerNorm and Linear act on channels
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        if self.gamma is not None:
            y = y * self.gamma
        return x + drop_path(y.permute(0, 3, 1, 2), self.drop_prob, self.training)


class ConvNeXt(nn.Module):
    def __init__(self, options: ConvNeXtOptions, num_classes: int):
        super().__init__()
        if num_classes < 2:
            raise ConfigError(f"the convnext recipe needs at least 2 classes, got {num_classes}")
        self.options, self.num_classes = options, num_classes
        o = options
        self.downsample = nn.ModuleList()
        self.downsample.append(nn.Sequential(nn.Conv2d(3, o.dims[0], kernel_size=4, stride=4),
                                             LayerNorm2d(o.dims[0], eps=1e-6)))
        for i in range(1, len(o.dims)):
            self.downsample.append(nn.Sequential(LayerNorm2d(o.dims[i - 1], eps=1e-6),
                                                 nn.Conv2d(o.dims[i - 1], o.dims[i], kernel_size=2, stride=2)))
        total = sum(o.depths)
        rates = [o.drop_path * i / max(total - 1, 1) for i in range(total)]
        self.stages = nn.ModuleList()
        k = 0
        for i, (depth, dim) in enumerate(zip(o.depths, o.dims)):
            kernel = depthwise_kernel(o.image_size // (4 * 2**i))
            self.stages.append(nn.Sequential(*(Block(dim, rates[k + j], o.layer_scale_init, kernel)
                                               for j in range(depth))))
            k += depth
        self.norm = nn.LayerNorm(o.dims[-1], eps=1e-6)
        self.head = nn.Linear(o.dims[-1], num_classes)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.trunc_normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, 3, H, W) normalized images -> logits (B, num_classes)."""
        for down, stage in zip(self.downsample, self.stages):
            x = stage(down(x))
        return self.head(self.norm(x.mean(dim=(2, 3))))


def classification_loss(model: nn.Module, batch) -> torch.Tensor:
    """Mean cross entropy; batch = (images (B,3,H,W), labels (B,))."""
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def accuracy_metrics(model: nn.Module, val_batches, limit: int | None = None) -> dict[str, float]:
    """Top-1 accuracy over the validation batches (at most `limit` of them)."""
    device = next(model.parameters()).device
    correct = total = 0
    with torch.no_grad():
        for i, (images, labels) in enumerate(val_batches):
            if limit is not None and i >= limit:
                break
            pred = model(images.to(device)).argmax(dim=1).cpu()
            correct += int((pred == labels).sum())
            total += int(labels.numel())
    return {"val_accuracy": correct / max(total, 1)}
