"""The `seqvae` recipe: a convolutional sequence VAE on long-tailed variable-length sequences, with
KL annealing and posterior-collapse metrics (KL per dimension, active units) at evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trainspeed.recipes.base import RecipeParts, parse_options, variant_path

if TYPE_CHECKING:
    from trainspeed.config import TrainConfig


class SeqVAERecipe:
    name = "seqvae"
    description = "Convolutional sequence VAE on variable-length sequences (20-1000 tokens) with posterior-collapse metrics"

    def options(self, config: TrainConfig):
        """The validated `recipe.options` (a SeqVAEOptions)."""
        from trainspeed.recipes.seqvae.model import SeqVAEOptions

        return parse_options(SeqVAEOptions, config.recipe.options)

    def build(self, config: TrainConfig) -> RecipeParts:
        import functools

        import torch

        from trainspeed.engine.data.collate import PadCollate
        from trainspeed.engine.data.stats import batch_stats
        from trainspeed.recipes.seqvae.data import PAD, make_datasets
        from trainspeed.recipes.seqvae.metrics import collapse_metrics
        from trainspeed.recipes.seqvae.model import SeqVAE, flops_per_token, vae_loss

        o = self.options(config)
        train, val = make_datasets(o, seed=o.data_seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.run.seed)
            model = SeqVAE(o)
        # Padding is decided by the engine's data switches, not here: data.dynamic_padding and
        # data.bucketing choose between padding to max_len (naive) and per-batch padding.
        return RecipeParts(
            model=model,
            loss_fn=vae_loss,
            train_data=train,
            val_data=val,
            collate_fn=PadCollate(pad_id=PAD, max_seq_len=o.max_len),
            batch_stats=batch_stats,
            lengths=train.lengths,
            eval_metrics=functools.partial(collapse_metrics, threshold=o.active_threshold,
                                           limit=config.eval.limit_val_batches),
            flops_per_token=flops_per_token(o),
        )

    def config_path(self, variant: str) -> Path:
        return variant_path(__file__, self.name, variant)


RECIPE = SeqVAERecipe()

__all__ = ["RECIPE", "SeqVAERecipe"]
