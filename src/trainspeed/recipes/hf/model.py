"""A Hugging Face `transformers` causal LM built from a config alone (random init, no weight
download): a model_type such as qwen2, gpt2 or llama with tiny sizes, or a local config.

Nothing here touches the network: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE are set before
transformers is imported (unless the user set them), and a config_path is read with
local_files_only=True.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from trainspeed.config_io import check_fields
from trainspeed.errors import ConfigError, require

BYTE_VOCAB = 256  # the gpt recipe's byte-level text: token ids 0..255


@dataclass(kw_only=True, slots=True)
class HFOptions:
    """`recipe.options` of the hf recipe (which transformers model, its size, the data)."""

    _prefix: ClassVar[str] = "recipe.options."
    model_type: str = "qwen2"
    """A transformers model type with a causal-LM head (qwen2, gpt2, llama, ...), built from
    its config class with the sizes below; ignored when config_path is set."""
    config_path: str | None = None
    """A local directory holding config.json (or the file itself): that architecture, random
    init; the size options below then override only when set."""
    hidden_size: int | None = None
    """Model width (null: 128, or the config file's)."""
    num_layers: int | None = None
    """Decoder layers (null: 2, or the config file's)."""
    num_heads: int | None = None
    """Attention heads (null: 4, or the config file's); must divide hidden_size."""
    num_kv_heads: int | None = None
    """Key/value heads for grouped-query attention (models that have it; null: = num_heads)."""
    intermediate_size: int | None = None
    """MLP width (null: 4 x hidden_size, or the config file's)."""
    block_size: int = 256
    """Context length in tokens (bytes)."""
    vocab_size: int | None = None
    """Vocabulary size (null: 256 for byte tokens, or the config file's; must be >= 256)."""
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    """Attention kernel: PyTorch SDPA (fused) or the model's eager matmul-softmax-matmul."""
    samples_per_epoch: int = 100_000
    """Windows in one training epoch (the corpus is sampled at deterministic offsets)."""
    val_samples: int = 512
    """Windows in the validation set."""

    def __post_init__(self) -> None:
        p = self._prefix
        check_fields(self, p)
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{p}{name} must be >= 1, got {value}")
        for name in ("block_size", "samples_per_epoch", "val_samples"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{p}{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size is not None and self.vocab_size < BYTE_VOCAB:
            raise ConfigError(f"{p}vocab_size must be >= {BYTE_VOCAB} (the training text is bytes), got {self.vocab_size}")
        if self.hidden_size and self.num_heads and self.hidden_size % self.num_heads:
            raise ConfigError(f"{p}hidden_size must be divisible by {p}num_heads, "
                              f"got hidden_size={self.hidden_size}, num_heads={self.num_heads}")
        if self.num_heads and self.num_kv_heads and self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{p}num_heads must be divisible by {p}num_kv_heads, "
                              f"got num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}")
        if not self.model_type and not self.config_path:
            raise ConfigError(f"{p}model_type is empty; name a transformers model type (e.g. qwen2, gpt2) or set {p}config_path")


def import_transformers():
    """transformers, with the Hub switched off (a recipe never downloads)."""
    from trainspeed import own_env

    own_env.setdefault("HF_HUB_OFFLINE", "1")  # remembered: not the user's, for printed commands
    own_env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return require("transformers", extra="hf", feature="the hf recipe")


def build_config(o: HFOptions) -> Any:
    """The transformers config: from config_path or model_type, with the size options applied.

    The config is constructed once from keyword arguments (not patched afterwards), so fields
    derived from the sizes (e.g. Qwen2's per-layer `layer_types`) agree with them. Generic
    names (hidden_size, ...) are translated by each config class's attribute_map (GPT-2: n_embd).
    """
    tf = import_transformers()
    p = HFOptions._prefix
    if o.config_path:
        base = _read_config_dict(o.config_path)
        model_type = base.get("model_type")
        defaults: dict[str, int] = {}
    else:
        base, model_type = {}, o.model_type
        defaults = {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "vocab_size": BYTE_VOCAB}
    if model_type not in tf.CONFIG_MAPPING:
        where = f"config_path={o.config_path!r} names model_type={model_type!r}" if o.config_path else f"model_type={model_type!r}"
        raise ConfigError(f"{p}{where}, which is not a transformers model type (e.g. qwen2, gpt2, llama)")
    cls = tf.CONFIG_MAPPING[model_type]
    alias = dict(getattr(cls, "attribute_map", {}) or {})

    def current(generic: str) -> Any:
        return base.get(alias.get(generic, generic))

    changes: dict[str, Any] = {
        "hidden_size": o.hidden_size or defaults.get("hidden_size"),
        "num_hidden_layers": o.num_layers or defaults.get("num_layers"),
        "num_attention_heads": o.num_heads or defaults.get("num_heads"),
        "vocab_size": o.vocab_size or defaults.get("vocab_size"),
    }
    changes = {k: v for k, v in changes.items() if v is not None}
    hidden = changes.get("hidden_size") or current("hidden_size")
    heads = changes.get("num_attention_heads") or current("num_attention_heads")
    inter = o.intermediate_size or (4 * hidden if not o.config_path and hidden else None)
    if inter is not None:
        changes["n_inner" if model_type == "gpt2" else "intermediate_size"] = inter
    if o.num_kv_heads or not o.config_path:
        changes["num_key_value_heads"] = o.num_kv_heads or heads
    if not o.config_path and hidden and heads:
        changes["head_dim"] = hidden // heads
    kwargs = dict(base)
    kwargs.pop("model_type", None)
    if "num_hidden_layers" in changes and changes["num_hidden_layers"] != current("num_hidden_layers"):
        kwargs.pop("layer_types", None)  # derived per layer: rebuilt for the new depth
    kwargs.update({alias.get(k, k): v for k, v in changes.items()})
    if not o.config_path:  # keys a model_type's config class does not know would stick as noise
        known = set(getattr(cls, "__dataclass_fields__", {})) | set(cls().to_dict())
        if o.num_kv_heads and "num_key_value_heads" not in known:
            raise ConfigError(f"{p}num_kv_heads is set but {model_type} has no grouped-query attention; set it to null")
        kwargs = {k: v for k, v in kwargs.items() if k in known or k in alias.values()}
    try:
        config = cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"the {model_type} config rejects these sizes ({', '.join(f'{k}={v}' for k, v in changes.items())}): {exc}") from exc
    if getattr(config, "max_position_embeddings", o.block_size) < o.block_size:
        config.max_position_embeddings = o.block_size
    if config.vocab_size < BYTE_VOCAB:
        raise ConfigError(f"the model's vocab_size is {config.vocab_size}, but the training text has "
                          f"{BYTE_VOCAB} byte values; set {p}vocab_size={BYTE_VOCAB}")
    if config.hidden_size % config.num_attention_heads:
        raise ConfigError(f"hidden_size={config.hidden_size} is not divisible by num_attention_heads="
                          f"{config.num_attention_heads}; set {p}hidden_size / {p}num_heads")
    config.use_cache = False  # training: no KV cache
    return config


def _read_config_dict(config_path: str) -> dict:
    """config.json of a local model directory (or the .json file itself) as a dict."""
    import json

    p = HFOptions._prefix
    path = Path(config_path).expanduser()
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file() or file.suffix != ".json":
        raise ConfigError(f"{p}config_path={config_path!r} is neither a directory with config.json "
                          "nor a .json file; give a local model directory (nothing is downloaded)")
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{p}config_path={config_path!r}: {file} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"{p}config_path={config_path!r}: {file} has no 'model_type'; is it a transformers config.json?")
    return data


def build_model(o: HFOptions):
    """AutoModelForCausalLM.from_config: random weights, fp32, on CPU."""
    tf = import_transformers()
    config = build_config(o)
    try:
        return tf.AutoModelForCausalLM.from_config(config, attn_implementation=o.attn_implementation)
    except ValueError as exc:
        raise ConfigError(f"{HFOptions._prefix}model_type={config.model_type!r} has no causal-LM model "
                          f"for this config (or attn_implementation={o.attn_implementation!r}): {exc}") from exc


def causal_lm_loss(model, batch):
    """Mean next-token cross entropy; batch = (x, y) already shifted by the data (so the
    model's own `labels=` shifting is not used)."""
    import torch.nn.functional as F

    x, y = batch
    logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))


def flops_per_token(model, block_size: int) -> float:
    """6N + 12*L*H*Q*T (PaLM appendix B), N = parameters doing matmuls per token: all but the
    input embedding table, counting the output head even when it is tied to it."""
    cfg = model.config
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is emb
    n = total if tied else total - emb.numel()
    layers, heads = cfg.num_hidden_layers, cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return float(6 * n + 12 * layers * heads * head_dim * block_size)
