"""The `convnext` recipe: a small ConvNeXt classifying an image folder decoded and augmented
on the CPU (a synthetic class-structured folder by default; your own with options.data_path)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trainspeed.recipes.base import RecipeParts, parse_options, variant_path

if TYPE_CHECKING:
    from trainspeed.config import TrainConfig


class ConvNeXtRecipe:
    name = "convnext"
    description = "ConvNeXt classifier on an image folder decoded + augmented with Pillow (synthetic by default)"

    def options(self, config: TrainConfig):
        """The validated `recipe.options` (a ConvNeXtOptions)."""
        from trainspeed.recipes.convnext.model import ConvNeXtOptions

        return parse_options(ConvNeXtOptions, config.recipe.options)

    def data_root(self, config: TrainConfig) -> Path:
        """options.data_path, or the synthetic folder (generated on first use)."""
        from trainspeed.recipes.cache import cache_dir
        from trainspeed.recipes.convnext.synth import ensure_folder

        o = self.options(config)
        if o.data_path:
            return Path(o.data_path).expanduser()
        return ensure_folder(cache_dir(), classes=o.synth_classes, per_class=o.synth_per_class,
                             val_per_class=o.synth_val_per_class, size=o.synth_image_size,
                             fmt=o.synth_format, seed=o.synth_seed)

    def build(self, config: TrainConfig) -> RecipeParts:
        import functools

        import torch

        from trainspeed.recipes.convnext.data import make_datasets
        from trainspeed.recipes.convnext.model import ConvNeXt, accuracy_metrics, classification_loss

        o = self.options(config)
        train, val = make_datasets(self.data_root(config), o.image_size, crop_scale_min=o.crop_scale_min,
                                   val_fraction=o.val_fraction, seed=config.run.seed)
        # Initialise under a private RNG state: the same seed gives the same weights however
        # much randomness the caller consumed before.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.run.seed)
            model = ConvNeXt(o, num_classes=len(train.classes))
        return RecipeParts(
            model=model,
            loss_fn=classification_loss,
            train_data=train,
            val_data=val,
            eval_metrics=functools.partial(accuracy_metrics, limit=config.eval.limit_val_batches),
        )

    def config_path(self, variant: str) -> Path:
        return variant_path(__file__, self.name, variant)


RECIPE = ConvNeXtRecipe()

__all__ = ["RECIPE", "ConvNeXtRecipe"]
