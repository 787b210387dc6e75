"""What a recipe is: a named workload that turns a TrainConfig into model, loss and data.

The engine only sees `RecipeParts`; a recipe never touches the training loop. Recipe-specific
settings live in `config.recipe.options` and are validated by the recipe's own options
dataclass via `parse_options` (errors name `recipe.options.<key>`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence, TypeVar, runtime_checkable

if TYPE_CHECKING:  # keep `import trainspeed.recipes.base` free of torch for the CLI
    import torch
    from torch import nn
    from torch.utils.data import Dataset

    from trainspeed.config import TrainConfig

VARIANTS = ("naive", "fast")

T = TypeVar("T")


@dataclass(kw_only=True, frozen=True)
class BatchStats:
    """What one batch holds, for throughput and padding figures. Frozen: the engine shares one
    object between batches of the same size."""

    samples: int
    """Number of samples (sequences, images) in the batch."""
    tokens: int = 0
    """Real (non-pad) tokens, for token-based throughput; 0 when not a sequence task."""
    pad_tokens: int = 0
    """Padding tokens the batch carries (wasted compute)."""


@dataclass(kw_only=True)
class RecipeParts:
    """Everything the engine needs to train a recipe."""

    model: nn.Module
    """The model, on CPU, in fp32; the engine moves and wraps it."""
    loss_fn: Callable[[nn.Module, Any], torch.Tensor]
    """loss_fn(model, batch) -> scalar mean loss; the batch is already on the device."""
    train_data: Dataset
    """Map-style training dataset; sampler order fully determines the data (exact resume)."""
    val_data: Dataset | None = None
    """Validation dataset, or None."""
    collate_fn: Callable | None = None
    """DataLoader collate_fn (None: PyTorch's default)."""
    batch_stats: Callable[[Any], BatchStats] | None = None
    """Counts samples/tokens/padding of a (host) batch; None: samples = len(first tensor)."""
    lengths: Sequence[int] | None = None
    """Per-sample lengths of train_data, for length bucketing (None: all alike)."""
    eval_metrics: Callable[[nn.Module, Iterable], dict] | None = None
    """Extra metrics computed at eval time over the validation batches."""
    flops_per_token: float | None = None
    """Analytic training FLOPs per token (forward + backward), for MFU."""


@runtime_checkable
class Recipe(Protocol):
    name: str
    description: str

    def build(self, config: TrainConfig) -> RecipeParts: ...

    def config_path(self, variant: str) -> Path: ...  # "naive" | "fast"


def parse_options(cls: type[T], options: dict[str, Any] | None) -> T:
    """Validate `config.recipe.options` with a recipe's options dataclass.

    Unknown keys fail with a suggestion (`unknown setting 'recipe.options.n_layr'; did you
    mean 'recipe.options.n_layer'?`); the dataclass's `__post_init__` checks ranges.
    """
    from trainspeed import config_io

    return config_io.from_dict(cls, options or {}, "recipe.options.")


def variant_path(package_file: str, recipe: str, variant: str) -> Path:
    """`<recipe package>/<variant>.yaml`, or ConfigError naming the variants that exist."""
    from trainspeed.errors import ConfigError

    if variant not in VARIANTS:
        raise ConfigError(f"recipe '{recipe}' has no variant '{variant}'; use one of {', '.join(VARIANTS)}")
    return Path(package_file).resolve().parent / f"{variant}.yaml"
