"""make_sinks: sink names from a config or the CLI -> Sink objects."""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainspeed.errors import ConfigError
from trainspeed.sinks.base import Sink
from trainspeed.telemetry import schema

SINK_NAMES: tuple[str, ...] = ("jsonl", "csv", "tensorboard", "console", "wandb")
_ALIASES = {"tb": "tensorboard", "w&b": "wandb", "json": "jsonl"}


def _section(config: dict[str, Any] | None, name: str) -> dict[str, Any]:
    value = (config or {}).get(name)
    return value if isinstance(value, dict) else {}


def resolve_name(name: str) -> str:
    """A canonical sink name, or ConfigError listing the valid ones with a suggestion."""
    key = name.strip().lower() if isinstance(name, str) else name
    key = _ALIASES.get(key, key)
    if key in SINK_NAMES:
        return key
    close = difflib.get_close_matches(str(key), SINK_NAMES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(
        f"unknown sink {name!r}; valid sinks are {', '.join(SINK_NAMES)}.{hint}"
    )


def make_sinks(
    run_dir: str | Path | None,
    names: Sequence[str | Sink],
    *,
    total_steps: int | None = None,
    config: dict[str, Any] | None = None,
) -> list[Sink]:
    """Build the named sinks for a run directory. Sink objects in `names` pass through.

    Optional keys read from `config` (the resolved config as a dict, also sent to W&B):
    run.name (W&B run name), logging.wandb_project, logging.wandb_mode, logging.tb_every.
    Unknown names raise ConfigError before any sink is created (no half-built set).
    """
    if isinstance(names, str):
        names = [names]
    resolved: list[str | Sink] = []
    for item in names:
        if isinstance(item, str):
            key = resolve_name(item)
            if key not in resolved:  # the same sink twice would write every record twice
                resolved.append(key)
        else:
            resolved.append(item)
    needs_dir = [n for n in resolved if n in ("jsonl", "csv", "tensorboard")]
    if needs_dir and run_dir is None:
        raise ConfigError(
            f"sinks {', '.join(map(str, needs_dir))} write into a run directory, but none was "
            "given; pass run_dir or use only 'console'/'wandb'"
        )
    run_path = Path(run_dir) if run_dir is not None else None
    logging = _section(config, "logging")
    sinks: list[Sink] = []
    for item in resolved:
        if not isinstance(item, str):
            sinks.append(item)
        elif item == "jsonl":
            from trainspeed.sinks.jsonl import JsonlSink

            sinks.append(JsonlSink(run_path))
        elif item == "csv":
            from trainspeed.sinks.csv_sink import CsvSink

            sinks.append(CsvSink(run_path))
        elif item == "tensorboard":
            from trainspeed.sinks.tensorboard import TensorBoardSink

            every = logging.get("tb_every", 1)
            sinks.append(TensorBoardSink(run_path / schema.TB_DIR, every=every, hparams=config))
        elif item == "console":
            from trainspeed.sinks.console import ConsoleSink

            sinks.append(ConsoleSink(total_steps=total_steps))
        elif item == "wandb":
            from trainspeed.sinks.wandb_sink import WandbSink

            mode = logging.get("wandb_mode")
            if mode in (None, "online") and os.environ.get("WANDB_MODE"):
                mode = None  # WANDB_MODE set in the environment beats the config's default "online"

            sinks.append(
                WandbSink(
                    project=logging.get("wandb_project"),
                    run_name=_section(config, "run").get("name"),
                    config=config,
                    mode=mode,
                    dir=run_path,
                )
            )
    return sinks
