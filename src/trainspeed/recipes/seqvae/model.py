"""A sequence VAE (Bowman et al. 2016, "Generating Sentences from a Continuous Space") with
dilated convolutions (Yang et al. 2017): the encoder reads the sequence into
q(z|x) = N(mu, diag(exp(logvar))); a causal decoder reconstructs it from z by teacher forcing.

Loss per real token = reconstruction (cross entropy over non-pad positions) + beta * KL / tokens,
i.e. the negative ELBO per token with the KL term weighted by an annealed beta (Bowman's KL
annealing; `cyclical` is Fu et al. 2019), the classic remedy for posterior collapse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from trainspeed.config_io import check_fields
from trainspeed.errors import ConfigError
from trainspeed.recipes.seqvae.data import BOS, PAD


@dataclass(kw_only=True, slots=True)
class SeqVAEOptions:
    """`recipe.options` of the seqvae recipe (model, KL annealing, data)."""

    _prefix: ClassVar[str] = "recipe.options."
    vocab_size: int = 64
    """Token ids including PAD=0 and BOS=1."""
    channels: int = 64
    """Width of embeddings and convolutions (encoder and decoder)."""
    layers: int = 4
    """Conv blocks in the encoder and in the decoder; block i has dilation 2**i."""
    kernel_size: int = 3
    """Convolution kernel size."""
    latent_dim: int = 16
    """Dimensions of z."""
    kl_schedule: Literal["linear", "cyclical", "constant"] = "linear"
    """beta(step): linear 0 -> beta_max over kl_anneal_steps; cyclical repeats a ramp (first
    half of each kl_anneal_steps period) then hold; constant is beta_max throughout."""
    kl_anneal_steps: int = 200
    """Ramp length (linear) or period (cyclical), in training forward passes."""
    beta_max: float = 1.0
    """Final KL weight."""
    active_threshold: float = 0.01
    """Active-unit threshold on Var_x(E_q[z|x]) (Burda et al. use 0.01)."""
    samples: int = 4096
    """Training sequences."""
    val_samples: int = 256
    """Validation sequences."""
    min_len: int = 20
    """Shortest sequence."""
    max_len: int = 1000
    """Longest sequence, and the length the naive config pads every batch to."""
    median_len: float = 80.0
    """Median of the lognormal length distribution."""
    len_sigma: float = 0.6
    """Shape of the lognormal length distribution (larger: longer tail)."""
    num_styles: int = 8
    """Hidden sequence styles (each a Markov chain over tokens) the latent code can capture."""
    data_seed: int = 0
    """Seed of the data generator (independent of run.seed, so every run sees the same data)."""

    def __post_init__(self) -> None:
        p = self._prefix
        check_fields(self, p)
        if self.kernel_size < 2:
            raise ConfigError(f"{p}kernel_size must be >= 2, got {self.kernel_size}")
        for name in ("channels", "layers", "latent_dim", "kl_anneal_steps", "samples",
                     "val_samples", "num_styles", "min_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{p}{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size < 4:
            raise ConfigError(f"{p}vocab_size must be >= 4 (PAD, BOS and at least two data tokens), got {self.vocab_size}")
        if self.max_len < self.min_len:
            raise ConfigError(f"{p}max_len must be >= {p}min_len, got max_len={self.max_len}, min_len={self.min_len}")
        if not self.min_len <= self.median_len <= self.max_len:
            raise ConfigError(f"{p}median_len must be in [min_len, max_len] = [{self.min_len}, {self.max_len}], got {self.median_len}")
        if self.len_sigma < 0:
            raise ConfigError(f"{p}len_sigma must be >= 0, got {self.len_sigma}")
        if self.beta_max < 0:
            raise ConfigError(f"{p}beta_max must be >= 0, got {self.beta_max}")
        if self.active_threshold <= 0:
            raise ConfigError(f"{p}active_threshold must be > 0, got {self.active_threshold}")
        if self.data_seed < 0:
            raise ConfigError(f"{p}data_seed must be >= 0, got {self.data_seed}")


def kl_beta(step: torch.Tensor, schedule: str, anneal_steps: int, beta_max: float) -> torch.Tensor:
    """KL weight at `step` (a tensor, so it stays on the device: no host sync per step)."""
    s = step.float()
    if schedule == "constant":
        return torch.full_like(s, beta_max)
    if schedule == "linear":
        return beta_max * torch.clamp(s / anneal_steps, max=1.0)
    phase = torch.remainder(s, anneal_steps) / anneal_steps  # cyclical: ramp half a period, hold
    return beta_max * torch.clamp(2.0 * phase, max=1.0)


class ConvBlock(nn.Module):
    """Residual block: LayerNorm -> dilated conv -> GELU -> 1x1 conv, added to the input.

    causal=True pads on the left only (position t sees tokens <= t: the decoder); otherwise
    both sides (the encoder). Per-position LayerNorm and the mask multiply keep padding from
    leaking into real positions, so the result does not depend on how much padding a batch has.
    """

    def __init__(self, channels: int, kernel_size: int, dilation: int, causal: bool):
        super().__init__()
        self.norm = nn.LayerNorm(channels)
        self.conv = nn.Conv1d(channels, channels, kernel_size, dilation=dilation)
        self.proj = nn.Conv1d(channels, channels, 1)
        span = (kernel_size - 1) * dilation
        self.pad = (span, 0) if causal else (span // 2, span - span // 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, C, L), mask (B, 1, L) float."""
        y = self.norm(x.transpose(1, 2)).transpose(1, 2)
        y = self.proj(F.gelu(self.conv(F.pad(y, self.pad))))
        return (x + y) * mask


class SeqVAE(nn.Module):
    """Encoder: token embeddings -> dilated conv blocks -> masked mean over real tokens ->
    (mu, logvar). Decoder: embeddings of the shifted sequence + a projection of z at every
    position -> causal dilated conv blocks -> logits (Yang et al. 2017, "Improved Variational
    Autoencoders for Text Modeling using Dilated Convolutions"). Convolutions instead of a GRU:
    on a CPU a 1000-step recurrence costs ~5 ms of per-op overhead per position, a convolution
    processes all positions at once, so the cost is proportional to the padded length."""

    def __init__(self, options: SeqVAEOptions):
        super().__init__()
        o = self.options = options
        C = o.channels
        self.embed = nn.Embedding(o.vocab_size, C, padding_idx=PAD)
        dilations = [2 ** i for i in range(o.layers)]
        self.encoder = nn.ModuleList(ConvBlock(C, o.kernel_size, d, causal=False) for d in dilations)
        self.to_mu = nn.Linear(C, o.latent_dim)
        self.to_logvar = nn.Linear(C, o.latent_dim)
        self.z_to_x = nn.Linear(o.latent_dim, C)
        self.decoder = nn.ModuleList(ConvBlock(C, o.kernel_size, d, causal=True) for d in dilations)
        self.norm = nn.LayerNorm(C)
        self.out = nn.Linear(C, o.vocab_size)
        # The KL-annealing step lives in the model as a buffer, not in the loss function or a
        # callback: it is then saved in checkpoints (a resumed run continues the schedule
        # exactly), broadcast by DDP with the other buffers, and incremented on the device
        # (no host sync). It counts training forward passes (micro-batches under accumulation).
        self.register_buffer("kl_step", torch.zeros((), dtype=torch.int64))

    @staticmethod
    def _mask(ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return (pos.unsqueeze(0) < lengths.to(ids.device).unsqueeze(1)).unsqueeze(1).float()

    def encode(self, ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (B, L) padded, lengths (B,) -> (mu, logvar), each (B, latent_dim)."""
        mask = self._mask(ids, lengths)
        x = self.embed(ids).transpose(1, 2) * mask  # (B, C, L)
        for block in self.encoder:
            x = block(x, mask)
        h = x.sum(dim=2) / mask.sum(dim=2).clamp(min=1.0)
        return self.to_mu(h), self.to_logvar(h)

    def decode(self, ids: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits (B, L, vocab) of ids given z: input t is token t-1 (BOS first).
        Causal blocks: padding after a sequence cannot change its real positions."""
        inputs = torch.cat([torch.full_like(ids[:, :1], BOS), ids[:, :-1]], dim=1)
        x = (self.embed(inputs) + self.z_to_x(z).unsqueeze(1)).transpose(1, 2)
        ones = x.new_ones(x.shape[0], 1, x.shape[2])
        for block in self.decoder:
            x = block(x, ones)
        return self.out(self.norm(x.transpose(1, 2)))

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor):
        """-> (logits, mu, logvar, beta). Training calls sample z and advance the KL schedule."""
        mu, logvar = self.encode(ids, lengths)
        o = self.options
        beta = kl_beta(self.kl_step, o.kl_schedule, o.kl_anneal_steps, o.beta_max)
        if self.training and torch.is_grad_enabled():
            z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)  # reparameterization
            self.kl_step.add_(1)
        else:
            z = mu
        return self.decode(ids, z), mu, logvar, beta


def vae_loss(model: nn.Module, batch) -> torch.Tensor:
    """Negative ELBO per real token with annealed KL; batch = (ids, mask, lengths) from PadCollate."""
    ids, mask, lengths = batch
    logits, mu, logvar, beta = model(ids, lengths)
    ce = F.cross_entropy(logits.transpose(1, 2), ids, reduction="none")  # (B, L)
    maskf = mask.to(ce.dtype)
    tokens = maskf.sum().clamp(min=1.0)
    recon = (ce * maskf).sum() / tokens
    kl = 0.5 * (mu.pow(2) + logvar.exp() - logvar - 1.0).sum()
    return recon + beta * kl / tokens


def flops_per_token(o: SeqVAEOptions) -> float:
    """Training FLOPs per token (forward + backward ~ 3x forward, 2 FLOPs per multiply-add):
    per conv block k*C*C + C*C (encoder and decoder), plus the output projection C*V.
    Per real token: the work spent on padding is waste and deliberately not counted."""
    C, V = o.channels, o.vocab_size
    macs = 2 * o.layers * (o.kernel_size * C * C + C * C) + C * V
    return float(6 * macs)
