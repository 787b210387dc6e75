"""The sections of a trainspeed run's settings (run, recipe, data, optim, precision, compile,
accumulation, logging, checkpoint, distributed, eval, batch, profile): each declares its keys,
their defaults and their ranges, and validates itself in `__post_init__`, naming the full key
in its errors. `config.py` puts them together into TrainConfig and loads, dumps and hashes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from trainspeed import config_io
from trainspeed.config_io import Section as _Section
from trainspeed.errors import ConfigError

SINKS = ("jsonl", "csv", "tensorboard", "console", "wandb")
IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
"""`recipe.name` of your own model: 'module:attr' (recipes/imported.py, docs/own-model.md)."""


@dataclass(kw_only=True, slots=True)
class RunConfig(_Section):
    _key: ClassVar[str] = "run"
    name: str | None = None
    """Run name; the run directory is <out_dir>/<name>. Default: '<recipe>-<YYYYmmdd-HHMMSS>'."""
    out_dir: str = "runs"
    """Parent directory of run directories."""
    seed: int = 0
    """Seed for model init, data order and dropout."""
    max_steps: int | None = None
    """Stop after this many optimizer steps. With max_epochs too, the first limit reached wins."""
    max_epochs: int | None = 1
    """Stop after this many passes over the training data (null: only max_steps counts)."""
    device: str = "auto"
    """'auto' (CUDA when available, else CPU), 'cpu', 'cuda' or 'cuda:N'."""
    deterministic: bool = False
    """Use deterministic kernels (torch.use_deterministic_algorithms); slower, reproducible."""
    torch_threads: int | None = None
    """torch.set_num_threads for intra-op CPU parallelism (null: PyTorch's default)."""

    def __post_init__(self) -> None:
        self._check()
        if self.name is not None and (not self.name or "/" in self.name or "\\" in self.name):
            self._fail("name", "a non-empty name without path separators")
        self._min("seed", 0)
        self._min("max_steps", 1, optional=True)
        self._min("max_epochs", 1, optional=True)
        if self.max_steps is None and self.max_epochs is None:
            raise ConfigError(
                "run.max_steps and run.max_epochs are both null; set at least one "
                "(e.g. run.max_steps=1000) so the run knows when to stop"
            )
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            self._fail("device", "'auto', 'cpu', 'cuda' or 'cuda:N'")
        self._min("torch_threads", 1, optional=True)


@dataclass(kw_only=True, slots=True)
class RecipeConfig(_Section):
    _key: ClassVar[str] = "recipe"
    name: str | None = None
    """Built-in recipe (`trainspeed recipes` lists them), or your own model as an import path
    'module:attr' (a function returning RecipeParts, or a Recipe class; docs/own-model.md)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Recipe-specific settings, validated by the recipe (errors name recipe.options.<key>)."""

    def __post_init__(self) -> None:
        self._check()
        if self.name is not None and ":" in self.name and not IMPORT_PATH.fullmatch(self.name):
            self._fail("name", "a recipe name or an import path 'module:attr' (e.g. 'mypkg.models:build')")


@dataclass(kw_only=True, slots=True)
class DataConfig(_Section):
    _key: ClassVar[str] = "data"
    batch_size: int = 32
    """Samples per micro-batch (per device). With bucketing, the upper bound on samples."""
    num_workers: int = 0
    """DataLoader worker processes (0: load in the training process)."""
    pin_memory: Literal["auto", True, False] = "auto"
    """Page-locked host buffers for faster, asynchronous copies; 'auto' = on with CUDA."""
    persistent_workers: bool = False
    """Keep workers alive between epochs (needs num_workers > 0)."""
    prefetch_factor: int | None = None
    """Batches each worker loads ahead (needs num_workers > 0); null: PyTorch's default (2)."""
    non_blocking: bool = True
    """Host-to-device copies with non_blocking=True (only asynchronous from pinned memory)."""
    device_prefetch: bool = False
    """Copy the next batch to the GPU on a side CUDA stream while this one computes; no-op on CPU."""
    shuffle: bool = True
    """Shuffle training samples each epoch (seeded by run.seed and the epoch)."""
    drop_last: bool = False
    """Drop the last incomplete batch (keeps shapes static, which torch.compile likes)."""
    dynamic_padding: bool = False
    """Pad each batch to its longest sample instead of max_seq_len."""
    bucketing: bool = False
    """Group samples of similar length into batches, so little padding is needed."""
    bucket_max_tokens: int | None = None
    """Token budget per batch with bucketing; null = batch_size x the longest length in the bucket."""
    bucket_num_buckets: int = 8
    """Number of length buckets with bucketing."""
    max_seq_len: int | None = None
    """Truncate/pad sequences to this length (null: the recipe's own limit)."""
    pad_id: int = 0
    """Token id used for padding."""

    def __post_init__(self) -> None:
        self._check()
        self._min("batch_size", 1)
        self._min("num_workers", 0)
        if self.prefetch_factor is not None:
            self._min("prefetch_factor", 1)
            if self.num_workers == 0:
                raise ConfigError(
                    f"data.prefetch_factor={self.prefetch_factor} needs data.num_workers > 0 "
                    "(workers do the prefetching); set data.num_workers or data.prefetch_factor=null"
                )
        if self.persistent_workers and self.num_workers == 0:
            raise ConfigError(
                "data.persistent_workers=true needs data.num_workers > 0; "
                "set data.num_workers or data.persistent_workers=false"
            )
        self._min("bucket_max_tokens", 1, optional=True)
        self._min("bucket_num_buckets", 1)
        self._min("max_seq_len", 1, optional=True)


@dataclass(kw_only=True, slots=True)
class OptimConfig(_Section):
    _key: ClassVar[str] = "optim"
    name: Literal["adamw", "sgd"] = "adamw"
    """Optimizer."""
    lr: float = 3e-4
    """Peak learning rate."""
    weight_decay: float = 0.01
    """Decoupled weight decay (AdamW) or L2 penalty (SGD)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    momentum: float = 0.0
    """SGD momentum."""
    implementation: Literal["auto", "fused", "foreach", "loop"] = "auto"
    """Kernel choice: fused (one kernel), foreach (grouped), loop (per tensor); auto = fastest available."""
    decay_norm_and_bias: bool = False
    """Apply weight decay to norms, biases and embeddings too (false: only to weight matrices)."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Learning-rate schedule after warm-up."""
    warmup_steps: int = 0
    """Linear warm-up steps from 0 to lr."""
    min_lr_ratio: float = 0.0
    """Final lr as a fraction of lr for cosine/linear decay."""
    grad_clip: float | None = None
    """Clip the global gradient norm to this value (null: no clipping)."""

    def __post_init__(self) -> None:
        self._check()
        self._positive("lr")
        self._min("weight_decay", 0)
        if not all(0 <= b < 1 for b in self.betas):
            self._fail("betas", "two values in [0, 1)")
        self._positive("eps")
        if not 0 <= self.momentum < 1:
            self._fail("momentum", "in [0, 1)")
        self._min("warmup_steps", 0)
        if not 0 <= self.min_lr_ratio <= 1:
            self._fail("min_lr_ratio", "in [0, 1]")
        self._positive("grad_clip", optional=True)


@dataclass(kw_only=True, slots=True)
class PrecisionConfig(_Section):
    _key: ClassVar[str] = "precision"
    mode: Literal["fp32", "tf32", "bf16-mixed", "fp16-mixed"] = "fp32"
    """Numeric precision. Mixed modes autocast matmuls; tf32 uses TF32 tensor cores (Ampere+)."""
    grad_scaler: Literal["auto", True, False] = "auto"
    """Loss scaling against fp16 gradient underflow; 'auto' = on exactly for fp16-mixed."""
    init_scale: float = 65536.0
    """Initial loss scale of the gradient scaler."""

    def __post_init__(self) -> None:
        self._check()
        if self.mode == "fp16-mixed" and self.grad_scaler is False:
            raise ConfigError(
                "precision.grad_scaler=false with precision.mode='fp16-mixed': fp16 gradients "
                "underflow to zero without loss scaling, so training silently stalls. "
                "Use precision.grad_scaler=auto, or precision.mode='bf16-mixed' (no scaler needed)"
            )
        self._positive("init_scale")

    @property
    def use_grad_scaler(self) -> bool:
        """Whether a GradScaler should run (resolves 'auto')."""
        if self.grad_scaler == "auto":
            return self.mode == "fp16-mixed"
        return bool(self.grad_scaler)


@dataclass(kw_only=True, slots=True)
class CompileConfig(_Section):
    _key: ClassVar[str] = "compile"
    mode: Literal["off", "default", "reduce-overhead", "max-autotune"] = "off"
    """torch.compile mode ('off': eager)."""
    fullgraph: bool = False
    """Fail on graph breaks instead of falling back to eager for those regions."""
    dynamic: bool | None = None
    """Dynamic shapes: null lets torch.compile decide after a recompile."""
    fallback_to_eager: bool = True
    """If compilation fails, log an event and continue in eager mode instead of stopping."""

    def __post_init__(self) -> None:
        self._check()


@dataclass(kw_only=True, slots=True)
class AccumulationConfig(_Section):
    _key: ClassVar[str] = "accumulation"
    steps: int = 1
    """Micro-batches per optimizer step."""
    normalize: Literal["mean", "tokens"] = "mean"
    """Average the loss over micro-batches ('mean') or weight by their token counts ('tokens')."""

    def __post_init__(self) -> None:
        self._check()
        self._min("steps", 1)


@dataclass(kw_only=True, slots=True)
class LoggingConfig(_Section):
    _key: ClassVar[str] = "logging"
    every: int = 50
    """Materialize loss/metrics and write records every N steps (each time is a host sync on CUDA)."""
    sinks: list[str] = field(default_factory=lambda: ["jsonl"])
    """Where records go: jsonl, csv, tensorboard, console, wandb."""
    warmup_steps: int = 5
    """First steps excluded from throughput figures."""
    progress: bool = True
    """Show a progress line on the terminal."""
    wandb_project: str | None = None
    """W&B project (with the wandb sink)."""
    wandb_mode: Literal["online", "offline", "disabled"] = "online"
    """W&B mode (with the wandb sink)."""

    def __post_init__(self) -> None:
        self._check()
        self._min("every", 1)
        for sink in self.sinks:
            if sink not in SINKS:
                guess = config_io.did_you_mean(sink, SINKS)
                hint = f"; did you mean '{guess}'?" if guess else ""
                raise ConfigError(
                    f"logging.sinks has unknown sink '{sink}' (allowed: {', '.join(SINKS)}){hint}"
                )
        if len(set(self.sinks)) != len(self.sinks):
            self._fail("sinks", "a list without duplicates")
        self._min("warmup_steps", 0)


@dataclass(kw_only=True, slots=True)
class CheckpointConfig(_Section):
    _key: ClassVar[str] = "checkpoint"
    dir: str | None = None
    """Checkpoint directory (null: <run_dir>/checkpoints)."""
    every_steps: int | None = None
    """Save every N optimizer steps."""
    every_minutes: float | None = None
    """Save when this many minutes passed since the last save."""
    keep_last: int = 3
    """Keep the newest N periodic checkpoints (0: keep all)."""
    keep_best: int = 0
    """Also keep the N best checkpoints by best_metric."""
    best_metric: str = "val_loss"
    """Metric ranking checkpoints for keep_best."""
    best_mode: Literal["min", "max"] = "min"
    """Whether lower or higher best_metric is better."""
    save_final: bool = True
    """Save at the end of training."""
    async_save: bool = True
    """Copy state to host memory, then write in a background thread."""
    mirror: str | None = None
    """fsspec URL to copy each finished checkpoint to (e.g. s3://bucket/run)."""
    resume: str | None = None
    """Checkpoint path (or 'latest' in dir) to resume from."""
    auto_resume: bool = False
    """Resume from the newest valid checkpoint in dir if there is one."""
    save_on_crash: bool = True
    """Try to save a checkpoint when training raises (not on OOM)."""
    requeue: bool = True
    """Under SLURM, after the save SIGUSR1 asks for (sbatch --signal=USR1@90), requeue the job
    (scontrol requeue); the requeued job continues this run from that checkpoint."""

    def __post_init__(self) -> None:
        self._check()
        self._min("every_steps", 1, optional=True)
        self._positive("every_minutes", optional=True)
        self._min("keep_last", 0)
        self._min("keep_best", 0)
        if not self.best_metric:
            self._fail("best_metric", "a metric name")


@dataclass(kw_only=True, slots=True)
class DistributedConfig(_Section):
    _key: ClassVar[str] = "distributed"
    strategy: Literal["none", "ddp", "fsdp", "deepspeed"] = "none"
    """Data parallelism across processes (launched with torchrun). deepspeed: DeepSpeed's engine
    (ZeRO stages 0-3, its bf16/fp16), configured by distributed.deepspeed and the keys below."""
    deepspeed: str | dict[str, Any] | None = None
    """strategy=deepspeed: a DeepSpeed config (path to its JSON, or the mapping inline). Batch
    size, accumulation, precision and gradient clipping come from data.*, accumulation.*,
    precision.* and optim.*; a config that sets them differently is an error that says which
    to keep. Null: ZeRO stage 0 with the engine's settings."""
    zero_stage: int | None = None
    """strategy=deepspeed: ZeRO stage 0-3, overriding the DeepSpeed config's
    zero_optimization.stage (null: the config's, else 0). Tuned by `trainspeed tune`."""
    overlap_comm: bool | None = None
    """strategy=deepspeed: overlap ZeRO's gradient reduction with backward, overriding
    zero_optimization.overlap_comm (null: the config's, else DeepSpeed's default)."""
    bucket_size: int | None = None
    """strategy=deepspeed: elements per ZeRO communication bucket (zero_optimization.
    reduce_bucket_size and allgather_bucket_size), overriding the config's (null: keep)."""
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """Process-group backend; auto = nccl with CUDA, else gloo."""
    timeout_s: float = 1800.0
    """Collective timeout in seconds."""
    signal_check_every: int = 10
    """FSDP: every N steps the ranks agree (one CPU all-reduce of one integer) whether one got
    SIGTERM/SIGINT; the signal checkpoint is saved at the first such step after the signal."""

    def __post_init__(self) -> None:
        self._check()
        self._positive("timeout_s")
        self._min("signal_check_every", 1)
        if self.zero_stage is not None and not 0 <= self.zero_stage <= 3:
            self._fail("zero_stage", "0, 1, 2 or 3 (or null: the DeepSpeed config's)")
        self._min("bucket_size", 1, optional=True)
        ds_keys = [k for k in ("deepspeed", "zero_stage", "overlap_comm", "bucket_size")
                   if getattr(self, k) is not None]
        if ds_keys and self.strategy != "deepspeed":
            raise ConfigError(
                f"distributed.{ds_keys[0]} is set but distributed.strategy is {self.strategy!r}; "
                "these keys configure DeepSpeed: set distributed.strategy=deepspeed, or remove them")


@dataclass(kw_only=True, slots=True)
class EvalConfig(_Section):
    _key: ClassVar[str] = "eval"
    every_steps: int | None = None
    """Evaluate on the validation data every N steps (null: never during training)."""
    limit_val_batches: int | None = None
    """Evaluate on at most this many batches (null: all)."""
    at_end: bool = True
    """Evaluate once after the last step."""

    def __post_init__(self) -> None:
        self._check()
        self._min("every_steps", 1, optional=True)
        self._min("limit_val_batches", 1, optional=True)


@dataclass(kw_only=True, slots=True)
class BatchConfig(_Section):
    _key: ClassVar[str] = "batch"
    auto_microbatch: bool = False
    """Find the largest micro-batch that fits in memory and accumulate up to data.batch_size."""

    def __post_init__(self) -> None:
        self._check()


@dataclass(kw_only=True, slots=True)
class ProfileConfig(_Section):
    _key: ClassVar[str] = "profile"
    steps: str | None = None
    """Run torch.profiler over this inclusive step range, written 'START-END' (e.g. '50-55')."""

    def __post_init__(self) -> None:
        self._check()
        if self.steps is not None:
            m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", self.steps)
            if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
                self._fail("steps", "a step range 'START-END' with 1 <= START <= END (steps count from 1), e.g. '50-55'")

    @property
    def step_range(self) -> tuple[int, int] | None:
        """(start, end) inclusive, or None when profiling is off."""
        if self.steps is None:
            return None
        start, end = self.steps.split("-")
        return int(start), int(end)
