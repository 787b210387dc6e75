"""Posterior-collapse metrics, computed at evaluation only (they need a pass over the
validation set; never per step).

- KL per latent dimension, averaged over the data: KL(q(z_d|x) || N(0,1)). A dimension whose
  KL is ~0 for every x carries no information about x (it collapsed to the prior).
- Active units (Burda et al. 2016, "Importance Weighted Autoencoders"): dimension d is active
  when Cov_x(E_q[z_d|x]) > 0.01, i.e. its posterior mean moves with the input.
- Reconstruction: mean cross entropy per real token, decoding from z = E_q[z|x].
The first two are pure functions of (mu, logvar) so they are testable on constructed numbers.
"""

from __future__ import annotations

from typing import Iterable

import torch

ACTIVE_THRESHOLD = 0.01


def kl_per_dim(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """(N, D) posterior parameters -> (D,) KL(N(mu, exp(logvar)) || N(0, 1)) averaged over N."""
    return (0.5 * (mu.pow(2) + logvar.exp() - logvar - 1.0)).mean(dim=0)


def active_units(mu: torch.Tensor, threshold: float = ACTIVE_THRESHOLD) -> int:
    """Number of dimensions whose posterior mean varies across inputs: Var_x(mu_d) > threshold."""
    if mu.shape[0] < 2:
        return 0  # a variance over one sample is undefined; nothing can be called active
    return int((mu.var(dim=0, unbiased=False) > threshold).sum())


def collapse_metrics(model, val_batches: Iterable, *, threshold: float = ACTIVE_THRESHOLD,
                     limit: int | None = None) -> dict:
    """kl, kl_per_dim, active_units, recon_loss of a SeqVAE over (at most `limit`) validation
    batches of (ids, mask, lengths)."""
    device = next(model.parameters()).device
    mus, logvars = [], []
    ce_sum = torch.zeros((), device=device)
    n_tokens = 0
    with torch.no_grad():
        for i, (ids, mask, lengths) in enumerate(val_batches):
            if limit is not None and i >= limit:
                break
            ids, mask, lengths = ids.to(device), mask.to(device), lengths.to(device)
            mu, logvar = model.encode(ids, lengths)
            logits = model.decode(ids, mu)
            ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids, reduction="none")
            ce_sum += (ce * mask).sum()
            n_tokens += int(lengths.sum())
            mus.append(mu.float().cpu())
            logvars.append(logvar.float().cpu())
    if not mus:
        return {}
    mu, logvar = torch.cat(mus), torch.cat(logvars)
    per_dim = kl_per_dim(mu, logvar)
    return {
        "recon_loss": float(ce_sum.item()) / max(n_tokens, 1),  # one sync per evaluation
        "kl": float(per_dim.sum()),
        "kl_per_dim": [round(float(v), 6) for v in per_dim],
        "active_units": active_units(mu, threshold),
        "latent_dims": int(mu.shape[1]),
    }
