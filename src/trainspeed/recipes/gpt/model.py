"""A GPT decoder (nanoGPT-style): token + position embeddings, pre-LN blocks, causal SDPA,
GELU MLP, tied input/output embeddings, GPT-2 initialisation. Plus its options dataclass."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from trainspeed.config_io import check_fields
from trainspeed.errors import ConfigError

# size -> (n_layer, n_head, n_embd). gpt2 is GPT-2 small: 124M parameters with its 50257-token
# vocabulary (set vocab_size=50257); with the default byte vocabulary it is ~85M.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (4, 4, 128),
    "small": (6, 6, 384),
    "gpt2": (12, 12, 768),
}


@dataclass(kw_only=True, slots=True)
class GPTOptions:
    """`recipe.options` of the gpt recipe (model shape and data sizes)."""

    _prefix: ClassVar[str] = "recipe.options."
    size: Literal["tiny", "small", "gpt2"] | None = "tiny"
    """Preset for n_layer/n_head/n_embd (tiny 4/4/128, small 6/6/384, gpt2 12/12/768)."""
    n_layer: int | None = None
    """Transformer blocks (null: from size)."""
    n_head: int | None = None
    """Attention heads (null: from size)."""
    n_embd: int | None = None
    """Model width (null: from size); must be divisible by n_head."""
    block_size: int = 256
    """Context length in tokens (bytes)."""
    vocab_size: int = 256
    """Vocabulary size; 256 for byte-level tokens."""
    dropout: float = 0.0
    """Dropout probability (attention, residual, embeddings)."""
    bias: bool = False
    """Biases in Linear and LayerNorm layers (GPT-2 had them; without is a bit faster)."""
    attention: Literal["auto", "torch", "cudnn"] = "auto"
    """SDPA backend asked for first: auto = cuDNN's attention on Hopper GPUs (faster there than
    FlashAttention-2, which torch releases before cuDNN 9.15 put first), torch's own order
    elsewhere; cudnn = cuDNN first on any GPU; torch = torch's order
    (recipes/gpt/attention_order.py)."""
    samples_per_epoch: int = 100_000
    """Windows in one training epoch (the corpus is sampled at deterministic offsets)."""
    val_samples: int = 512
    """Windows in the validation set."""

    def __post_init__(self) -> None:
        check_fields(self, self._prefix)
        preset = PRESETS.get(self.size) if self.size else None
        for name, index in (("n_layer", 0), ("n_head", 1), ("n_embd", 2)):
            if getattr(self, name) is None:
                if preset is None:
                    raise ConfigError(
                        f"{self._prefix}{name} is not set and {self._prefix}size is null; "
                        f"set {self._prefix}{name} or a size ({', '.join(PRESETS)})"
                    )
                setattr(self, name, preset[index])
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "samples_per_epoch", "val_samples"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{self._prefix}{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ConfigError(
                f"{self._prefix}n_embd must be divisible by {self._prefix}n_head, "
                f"got n_embd={self.n_embd}, n_head={self.n_head}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"{self._prefix}dropout must be in [0, 1), got {self.dropout}")


class CausalSelfAttention(nn.Module):
    def __init__(self, o: GPTOptions):
        super().__init__()
        self.n_head = o.n_head
        self.c_attn = nn.Linear(o.n_embd, 3 * o.n_embd, bias=o.bias)
        self.c_proj = nn.Linear(o.n_embd, o.n_embd, bias=o.bias)
        self.dropout = o.dropout
        self.resid_dropout = nn.Dropout(o.dropout)
        self.sdpa_order: list | None = None
        """SDPA backends in priority order (None: torch's own); set by GPT.use_sdpa_order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, H, T, D): SDPA wants heads before time.
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        if self.sdpa_order is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            from torch.nn.attention import sdpa_kernel

            with sdpa_kernel(self.sdpa_order, set_priority=True):
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, o: GPTOptions):
        super().__init__()
        self.c_fc = nn.Linear(o.n_embd, 4 * o.n_embd, bias=o.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * o.n_embd, o.n_embd, bias=o.bias)
        self.dropout = nn.Dropout(o.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LN transformer block (the unit to name in `activation_checkpointing: [Block]`)."""

    def __init__(self, o: GPTOptions):
        super().__init__()
        self.ln_1 = nn.LayerNorm(o.n_embd, bias=o.bias)
        self.attn = CausalSelfAttention(o)
        self.ln_2 = nn.LayerNorm(o.n_embd, bias=o.bias)
        self.mlp = MLP(o)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, options: GPTOptions):
        super().__init__()
        self.options = options
        o = options
        self.wte = nn.Embedding(o.vocab_size, o.n_embd)
        self.wpe = nn.Embedding(o.block_size, o.n_embd)
        self.drop = nn.Dropout(o.dropout)
        self.h = nn.ModuleList(Block(o) for _ in range(o.n_layer))
        self.ln_f = nn.LayerNorm(o.n_embd, bias=o.bias)
        self.lm_head = nn.Linear(o.n_embd, o.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying (one matrix, two uses)
        self.apply(self._init_weights)
        # GPT-2: scale residual projections by 1/sqrt(2 * n_layer) so the residual stream's
        # variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * o.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def use_sdpa_order(self, order: list | None) -> None:
        """Every attention layer asks SDPA for backends in this order (None: torch's own)."""
        for block in self.h:
            block.attn.sdpa_order = order

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; non_embedding drops the position table (token table = lm_head)."""
        n = sum(p.numel() for p in self.parameters())  # tied weight counted once
        return n - self.wpe.weight.numel() if non_embedding else n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) int64 token ids -> logits (B, T, vocab_size); with `targets` (B, T), the
        mean next-token cross entropy instead, computed inside the forward (nanoGPT's shape): a
        compiled model then fuses the loss with the lm_head, and the (B, T, vocab) logits are
        never read back in a separate eager pass (at GPT-2's 50304-token vocabulary, 32 x 1024
        tokens: 3.3 GB of bf16 logits, upcast to fp32 by an eager cross entropy)."""
        T = idx.shape[1]
        if T > self.options.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.options.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def count_params(o: GPTOptions, non_embedding: bool = True) -> int:
    """Parameters of GPT(o) without building it (matches GPT.num_params)."""
    d, b = o.n_embd, int(o.bias)
    ln = d + b * d
    block = 2 * ln + (3 * d * d + b * 3 * d) + (d * d + b * d) + (4 * d * d + b * 4 * d) + (4 * d * d + b * d)
    n = o.vocab_size * d + o.block_size * d + o.n_layer * block + ln  # lm_head is tied to wte
    return n - o.block_size * d if non_embedding else n


def flops_per_token(model: GPT) -> float:
    """Training FLOPs per token, forward + backward: 6N + 12·L·H·Q·T.

    The PaLM (appendix B) / nanoGPT MFU estimate: 6 FLOPs per parameter per token for the
    matmuls (2 forward, 4 backward) plus the attention score/value matmuls, which grow with
    context length T (H heads of dimension Q in each of L layers).
    """
    o = model.options
    n = model.num_params(non_embedding=True)
    return float(6 * n + 12 * o.n_layer * o.n_head * (o.n_embd // o.n_head) * o.block_size)


def lm_loss(model: nn.Module, batch) -> torch.Tensor:
    """Mean next-token cross entropy; batch = (x, y) of shape (B, T)."""
    x, y = batch
    return model(x, targets=y)  # the loss inside the (compiled) forward: see GPT.forward
