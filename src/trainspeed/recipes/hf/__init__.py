"""The `hf` recipe: a Hugging Face transformers causal LM (qwen2, gpt2, llama, ... or a local
config; random init, no download) trained on the gpt recipe's byte-level text."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trainspeed.recipes.base import RecipeParts, parse_options, variant_path

if TYPE_CHECKING:
    from trainspeed.config import TrainConfig


class HFRecipe:
    name = "hf"
    description = "Hugging Face transformers causal LM from a config (qwen2/gpt2/local; no download) on byte-level text"

    def options(self, config: TrainConfig):
        """The validated `recipe.options` (an HFOptions)."""
        from trainspeed.recipes.hf.model import HFOptions

        return parse_options(HFOptions, config.recipe.options)

    def build(self, config: TrainConfig) -> RecipeParts:
        import torch

        from trainspeed.recipes.gpt import batch_stats
        from trainspeed.recipes.gpt.data import make_datasets
        from trainspeed.recipes.hf.model import build_model, causal_lm_loss, flops_per_token

        o = self.options(config)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.run.seed)
            model = build_model(o)
        train, val = make_datasets(o.block_size, o.samples_per_epoch, o.val_samples, seed=config.run.seed)
        return RecipeParts(
            model=model,
            loss_fn=causal_lm_loss,
            train_data=train,
            val_data=val,
            batch_stats=batch_stats,
            flops_per_token=flops_per_token(model, o.block_size),
        )

    def config_path(self, variant: str) -> Path:
        return variant_path(__file__, self.name, variant)


RECIPE = HFRecipe()

__all__ = ["RECIPE", "HFRecipe"]
