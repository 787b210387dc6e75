"""The `gpt` recipe: a GPT decoder learning the bytes of the Python standard library."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainspeed.recipes.base import BatchStats, RecipeParts, parse_options, variant_path

if TYPE_CHECKING:
    from trainspeed.config import TrainConfig


def batch_stats(batch: Any) -> BatchStats:
    """Fixed-length windows: every token is real, none is padding."""
    x = batch[0]
    return BatchStats(samples=int(x.shape[0]), tokens=int(x.numel()), pad_tokens=0)


class GPTRecipe:
    name = "gpt"
    description = "GPT decoder on byte-level Python stdlib source (no download; tiny/small/gpt2 sizes)"

    def options(self, config: TrainConfig):
        """The validated `recipe.options` (a GPTOptions)."""
        from trainspeed.recipes.gpt.model import GPTOptions

        return parse_options(GPTOptions, config.recipe.options)

    def build(self, config: TrainConfig) -> RecipeParts:
        import torch

        from trainspeed.recipes.gpt.attention_order import cuda_capability_major, sdpa_order
        from trainspeed.recipes.gpt.data import make_datasets
        from trainspeed.recipes.gpt.model import GPT, flops_per_token, lm_loss

        opts = self.options(config)
        # Initialise under a private RNG state: the same seed gives the same weights however
        # much randomness the caller consumed before.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.run.seed)
            model = GPT(opts)
        model.use_sdpa_order(sdpa_order(opts.attention, cuda_capability_major(config.run.device)))
        train, val = make_datasets(
            opts.block_size, opts.samples_per_epoch, opts.val_samples, seed=config.run.seed
        )
        return RecipeParts(
            model=model,
            loss_fn=lm_loss,
            train_data=train,
            val_data=val,
            batch_stats=batch_stats,
            flops_per_token=flops_per_token(model),
        )

    def config_path(self, variant: str) -> Path:
        return variant_path(__file__, self.name, variant)


RECIPE = GPTRecipe()

__all__ = ["RECIPE", "GPTRecipe", "batch_stats"]
