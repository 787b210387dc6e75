"""Every setting of a trainspeed run, as dataclasses; YAML load/dump; CLI overrides.

    cfg = load_config("recipes/gpt/fast.yaml", ["data.num_workers=4", "--optim.lr", "3e-4"])

Precedence: CLI overrides > YAML > the defaults below. Each section validates itself in
`__post_init__` and names the full key in its errors (`data.num_workers must be >= 0, got -2`);
unknown keys fail with a "did you mean" suggestion. The generic machinery lives in
`config_io.py`, each section's settings and their ranges in `config_sections.py`; this file
puts the sections together and loads, dumps and hashes the whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from trainspeed import config_io
from trainspeed.config_io import Section as _Section
from trainspeed.config_io import apply_overrides
from trainspeed.config_sections import (IMPORT_PATH, SINKS, AccumulationConfig, BatchConfig, CheckpointConfig,
                                        CompileConfig, DataConfig, DistributedConfig, EvalConfig, LoggingConfig,
                                        OptimConfig, PrecisionConfig, ProfileConfig, RecipeConfig, RunConfig)
from trainspeed.errors import ConfigError

__all__ = [
    "TrainConfig", "RunConfig", "RecipeConfig", "DataConfig", "OptimConfig", "PrecisionConfig",
    "CompileConfig", "AccumulationConfig", "LoggingConfig", "CheckpointConfig",
    "DistributedConfig", "EvalConfig", "BatchConfig", "ProfileConfig",
    "load_config", "config_to_dict", "dump_config", "apply_overrides", "config_hash", "recipe_label",
    "IMPORT_PATH", "SINKS",
]


def recipe_label(name: str | None) -> str:
    """A recipe name fit for a directory name: 'gpt' -> 'gpt', 'mypkg.models:build' -> 'models-build'."""
    if not name:
        return "run"
    if ":" not in name:
        return name
    module, attr = name.split(":", 1)
    return f"{module.rsplit('.', 1)[-1]}-{attr.rsplit('.', 1)[-1]}"


@dataclass(kw_only=True, slots=True)
class TrainConfig(_Section):
    """The full, resolved configuration of one training run."""

    run: RunConfig = field(default_factory=RunConfig)
    """Run identity, length, device."""
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    """Built-in workload and its options."""
    data: DataConfig = field(default_factory=DataConfig)
    """Loading, batching, padding."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and learning-rate schedule."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Numeric precision."""
    compile: CompileConfig = field(default_factory=CompileConfig)
    """torch.compile."""
    accumulation: AccumulationConfig = field(default_factory=AccumulationConfig)
    """Gradient accumulation."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Telemetry and sinks."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Saving and resuming."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Multi-process training."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Validation."""
    batch: BatchConfig = field(default_factory=BatchConfig)
    """Batch-size helpers."""
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    """torch.profiler capture."""
    channels_last: bool = False
    """Convert the model and image batches to channels_last memory format (convnets)."""
    activation_checkpointing: list[str] = field(default_factory=list)
    """Class names of modules whose activations are recomputed in backward (e.g. ['Block'])."""
    nan_policy: Literal["skip", "stop", "ignore"] = "stop"
    """On a NaN/Inf loss: skip that step (a host sync every step), stop the run (no per-step cost;
    within logging.every steps), or ignore it. See engine/nonfinite.py."""

    def __post_init__(self) -> None:
        self._check()
        if self.run.name is None:
            # Derived once, here, so the dumped config names the run directory it wrote.
            self.run.name = f"{recipe_label(self.recipe.name)}-{time.strftime('%Y%m%d-%H%M%S')}"
        if self.data.bucket_max_tokens is not None and not self.data.bucketing:
            raise ConfigError(
                "data.bucket_max_tokens is set but data.bucketing=false; "
                "set data.bucketing=true or data.bucket_max_tokens=null"
            )


# --------------------------------------------------------------------------- functions


def load_config(
    path_or_dict: str | os.PathLike | dict[str, Any] | TrainConfig | None = None,
    overrides: Sequence[str] = (),
) -> TrainConfig:
    """Build a validated TrainConfig from a YAML file, a dict or a config, plus CLI overrides.

    Overrides take `data.num_workers=4`, `--data.num_workers=4` or `--data.num_workers 4`;
    values are YAML scalars (`4`, `true`, `null`, `[a,b]`, `3e-4`).
    """
    if path_or_dict is None:
        data: dict[str, Any] = {}
    elif isinstance(path_or_dict, TrainConfig):
        data = config_to_dict(path_or_dict)
    elif isinstance(path_or_dict, dict):
        data = path_or_dict
    else:
        data = config_io.read_yaml(path_or_dict)
    data = apply_overrides(data, overrides)
    return config_io.from_dict(TrainConfig, data)


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain nested dict (lists, no tuples) that `load_config` turns back into an equal config."""
    return config_io.to_dict(cfg)


def dump_config(cfg: TrainConfig, path: str | os.PathLike, *, write: Callable[..., Path] | None = None) -> Path:
    """Write the resolved config as YAML (atomically, or through `write`: config_io); returns the path."""
    config_io.write_yaml_atomic(path, config_to_dict(cfg), write=write)
    return Path(path)


# Keys that name where a run goes, not what it computes; two runs differing only here are the
# same experiment (run.name even defaults to a timestamp).
_HASH_EXCLUDED = (("run", "name"), ("run", "out_dir"))


def config_hash(cfg: TrainConfig) -> str:
    """Stable 16-hex-digit hash of the config, ignoring run.name and run.out_dir."""
    data = config_to_dict(cfg)
    for section, key in _HASH_EXCLUDED:
        data[section].pop(key, None)
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
