"""`trainspeed tune` end to end: prepare the trial config, run the search, write the outputs.

    <out>/base.yaml     the user's config with trial lengths set (what every trial loads)
    <out>/trials/       one run directory per trial
    <out>/tune.jsonl    finished trials (resume)
    <out>/tune.json     the tables as data
    <out>/tune.html     the tables as a page
    <out>/tune.md       the tables as Markdown
    <out>/best.yaml     the user's config with the winning settings, for `trainspeed train`

best.yaml and the tables land as one set (output_set): a disk that fills while they are
written leaves the earlier tune's set as it was, never a new best.yaml beside an old tune.json.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

from trainspeed.config import TrainConfig, config_hash, config_to_dict, dump_config, load_config
from trainspeed.fileset import FileSet, staged
from trainspeed.tune.knobs import DeviceInfo
from trainspeed.tune.progress import ProgressPrinter
from trainspeed.tune.result import TuneResult
from trainspeed.tune.search import TuneOptions, Tuner, apply_settings
from trainspeed.tune.store import STORE_FILE, TrialStore
from trainspeed.tune.trials import Runner, SubprocessRunner


@dataclass(kw_only=True)
class TrialLength:
    warmup_steps: int = 5
    """Steps excluded from timing (allocator warm-up, compilation)."""
    measure_steps: int = 25
    """Measured steps per trial; their mean step time (slowest 5 % left out) is the trial's figure."""
    eval_batches: int = 4
    """Validation batches at the end of each trial (the loss-parity figure)."""
    epoch_span: float = 3.0
    """A trial runs on past its epoch's end, to measure one epoch start (worker restarts: what
    persistent_workers saves), when that keeps it within this many times its plain length.
    Longer epochs start too rarely for their start to weigh."""

    def steps(self, steps_per_epoch: int | None = None) -> int:
        """Steps per trial: warm-up + measured, extended to the first epoch start after the
        warm-up (plus EPOCH_TAIL steps) when that fits in epoch_span x the plain length."""
        plain = self.warmup_steps + self.measure_steps
        if not steps_per_epoch:
            return plain
        k = max(1, -(-self.warmup_steps // steps_per_epoch))  # first k with k*E + 1 > warm-up
        first_start = k * steps_per_epoch + 1  # 1-based step number
        if first_start <= plain:
            return plain
        extended = first_start + EPOCH_TAIL
        return extended if extended <= self.epoch_span * plain else plain


EPOCH_TAIL = 4
"""Steps measured after an epoch start: the loader's refill shows in them too."""


def trial_config(cfg: TrainConfig, length: TrialLength, steps_per_epoch: int | None = None) -> dict[str, Any]:
    """The user's config, shortened into a trial: same model, data and speed settings."""
    d = config_to_dict(cfg)
    d["run"].update(name=None, max_steps=length.steps(steps_per_epoch), max_epochs=None)
    d["logging"].update(warmup_steps=length.warmup_steps, progress=False, wandb_mode="disabled")
    d["checkpoint"].update(save_final=False, resume=None, auto_resume=False, mirror=None)
    limit = d["eval"].get("limit_val_batches")
    d["eval"].update(every_steps=None, at_end=True,
                     limit_val_batches=min(limit or length.eval_batches, length.eval_batches))
    d["profile"]["steps"] = None
    return d


@dataclass
class RecipeFacts:
    """What the tuner reads from the recipe itself before any trial."""

    block_classes: list[str]
    """Repeated module classes with parameters (transformer blocks, conv stages), most
    repeated first: what activation checkpointing would wrap."""
    steps_per_epoch: int | None
    """Optimizer steps per epoch of the config's training loader (None: unknown)."""
    modules: tuple[str, ...] = ()
    """Modules first imported by building the recipe here (its model library, its data
    code), in import order: every trial imports them too, so the fork server imports them
    once (transformers with a Qwen2 model: ~1.3 s a trial)."""


def probe_recipe(cfg: TrainConfig) -> RecipeFacts:
    """Build the recipe (model and loaders, no worker started) and read its facts. Best
    effort: what cannot be read is empty, and the knobs and trial length say so or do without."""
    blocks: list[str] = []
    per_epoch = None
    before = set(sys.modules)
    try:
        from collections import Counter

        import torch

        from trainspeed.engine.schedule import steps_per_epoch
        from trainspeed.engine.setup import DataParts, build_loaders
        from trainspeed.recipes.registry import get_recipe

        parts = get_recipe(cfg.recipe.name).build(cfg)
        model = parts.model
        # The model's own classes only: torch containers (Sequential, ModuleList) are not blocks.
        counts = Counter(type(m).__name__ for m in model.modules()
                         if m is not model and not type(m).__module__.startswith("torch.")
                         and any(True for _ in m.parameters()) and len(list(m.children())) > 1)
        blocks = [name for name, n in counts.most_common() if n >= 2]
        data = DataParts(train=parts.train_data, collate_fn=parts.collate_fn, lengths=parts.lengths)
        per_epoch = steps_per_epoch(build_loaders(data, cfg, torch.device("cpu")).train, cfg.accumulation.steps)
    except Exception:  # noqa: BLE001 - best effort, see above
        pass
    return RecipeFacts(block_classes=blocks, steps_per_epoch=per_epoch, modules=_new_modules(before))


def _new_modules(before: set[str]) -> tuple[str, ...]:
    """Modules imported since `before` that can be imported again by name (a real spec: not
    a lazy alias, a namespace stand-in or __main__), in the order they were imported."""
    return tuple(name for name, module in list(sys.modules.items())
                 if name not in before and not name.startswith("__")
                 and isinstance(module, types.ModuleType) and getattr(module, "__spec__", None) is not None)


def find_block_classes(cfg: TrainConfig) -> list[str]:
    """Repeated module classes of the recipe's model (see RecipeFacts.block_classes)."""
    return probe_recipe(cfg).block_classes


def run_tune(cfg: TrainConfig, out_dir: str | Path, options: TuneOptions, *,
             length: TrialLength | None = None, runner: Runner | None = None,
             device: DeviceInfo | None = None, say: Callable[[str], None] | None = None,
             trial_timeout_s: float = 600.0) -> TuneResult:
    if say is None:
        say = ProgressPrinter()  # folded to the terminal's width, or a log's (progress.py)
    if not cfg.recipe.name:
        from trainspeed.errors import ConfigError

        raise ConfigError("recipe.name is not set: trials run `trainspeed train CONFIG`, which needs a "
                          "config naming a recipe (e.g. recipe: {name: gpt})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    length = length or TrialLength()
    facts = probe_recipe(cfg)
    steps = length.steps(facts.steps_per_epoch)
    if steps > length.warmup_steps + length.measure_steps:
        say(f"epochs of {facts.steps_per_epoch} steps: each trial runs {steps} steps, to measure one "
            "epoch start (its extra time counts once per epoch)")
    base = trial_config(cfg, length, facts.steps_per_epoch)
    base_cfg = load_config(base)
    base_cfg.run.name = None  # type: ignore[assignment] - dumped as null: each trial names itself
    base_path = out / "base.yaml"
    dump_config(base_cfg, base_path)
    base_hash = config_hash(load_config(base_path))
    device = device or DeviceInfo.detect(cfg.run.device)
    if runner is None:
        runner = SubprocessRunner(base_config=base_path, out_dir=out / "trials", timeout_s=trial_timeout_s,
                                  fork_server=options.fork_server, say=say,
                                  preload=facts.modules + deepspeed_preload(cfg, device))
    store = TrialStore(out)
    if len(store):
        say(f"resuming: {len(store)} finished trials in {store.path} (those of this config are reused; "
            "another --out starts afresh)")
    blocks = facts.block_classes if "activation_checkpointing" in options.knobs else []
    tuner = Tuner(base_config=config_to_dict(base_cfg), base_hash=base_hash, device=device,
                  runner=runner, store=store, options=options, block_classes=blocks, say=say)
    result = run_then_close(tuner, runner)
    write_outputs(cfg, result, out)
    return result


DEEPSPEED_MODULES = ("deepspeed", "deepspeed.runtime.zero.muon.muon_optimizer")
"""What a DeepSpeed trial imports before its first step: DeepSpeed (~2.5 s of CPU), and the
module deepspeed.initialize imports to check the optimizer, which torch.compile-decorates
functions at import and so imports inductor (~3 s). A module another DeepSpeed version lacks
is skipped by the fork server."""


def deepspeed_preload(cfg: TrainConfig, device: DeviceInfo) -> tuple[str, ...]:
    """DEEPSPEED_MODULES for a DeepSpeed config tuned on the CPU: the fork server imports them
    once instead of every trial (trials of a tiny gpt took 5-15 s without, 2-5 s with them on a
    loaded 2-core VM; ~1 s of each was training).
    DeepSpeed picks its accelerator at import and keeps it, so the server must import it with
    DS_ACCELERATOR=cpu, which every trial's engine sets on the CPU anyway
    (deepspeed_engine.import_deepspeed): set here too, where the server inherits it. On a GPU
    each trial imports it itself: a fork server must not start CUDA."""
    import os

    if cfg.distributed.strategy != "deepspeed" or device.type != "cpu":
        return ()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return DEEPSPEED_MODULES


def run_then_close(tuner: Tuner, runner: Runner) -> TuneResult:
    """Run the search; stop the runner's fork server (if any) however it ends."""
    try:
        return tuner.run()
    finally:
        close = getattr(runner, "close", None)
        if close is not None:
            close()


def best_config(cfg: TrainConfig, settings: dict[str, Any]) -> TrainConfig:
    d = config_to_dict(cfg)
    d["run"]["name"] = None  # a fresh timestamped name per run, not the tuned run's
    return load_config(apply_settings(d, settings))


OUTPUTS = ("best.yaml", "tune.json", "tune.md", "tune.html")
"""The files a recipe tune writes into --out (a script tune's: script_session.SCRIPT_OUTPUTS).
They land as one set (output_set); a name of the set this tune does not write is removed, so an
earlier tune's best.patch never sits beside this tune's best.yaml looking like its change."""


def output_set(out: Path, names: tuple[str, ...] = OUTPUTS, keep: tuple[str, ...] = ()) -> ContextManager[FileSet]:
    """Stage the tune's outputs `names` in `out`; they are put in place together when the block
    ends, or (a full disk, any failed write) none is and the earlier ones stay: trainspeed.fileset.
    `keep`: names never removed (a user's own file of that name). The rerun the message asks for
    reuses the finished trials: Tuner.trial takes each (key, repeat) tune.jsonl holds."""
    return staged(out, names, keep=keep, what="the tune's outputs", again=(
        "run the same tune command again, from the same directory, with the same --out: its finished "
        f"trials ({out / STORE_FILE}) are reused, not measured again"))


def write_outputs(cfg: TrainConfig, result: TuneResult, out: Path) -> None:
    from trainspeed.tune.table import markdown, write_html

    best = best_config(cfg, result.best_settings)
    best.run.name = None  # type: ignore[assignment]
    subtitle = f"{cfg.recipe.name or 'config'} · {out} · {result.trials_run} trials run"
    with output_set(out) as files:
        dump_config(best, out / "best.yaml", write=files.write_text)
        files.write_text(out / "tune.json", json.dumps(result.as_dict(), indent=2, default=str) + "\n")
        files.write_text(out / "tune.md", markdown(result))  # paste-ready for a README or an issue
        write_html(result, out / "tune.html", title="trainspeed tune", subtitle=subtitle, write=files.write_text)


def parse_budget(text: str) -> float:
    """'10m' -> 600, '90s' -> 90, '1h' -> 3600, '300' -> 300 seconds."""
    from trainspeed.errors import ConfigError

    t = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if t and t[-1] in units:
            value = float(t[:-1]) * units[t[-1]]
        else:
            value = float(t)
    except ValueError:
        raise ConfigError(f"--budget {text!r} is not a duration; write e.g. 90s, 10m or 1h") from None
    if value <= 0:
        raise ConfigError(f"--budget must be positive, got {text!r}")
    return value


__all__ = ["run_tune", "TrialLength", "trial_config", "best_config", "parse_budget", "output_set", "OUTPUTS"]
