"""Trials of an unchanged script: `trainspeed run --with PLAN --doctor --steps N -- CMD` per
trial, each its own process (forked from the fork server where that works), the settings
applied by patches before the script's first line and its own flags set on its command line.

The trial's run directory is a doctor run: its step records give the step times, samples and
losses the search compares, exactly as for a recipe trial (result_from_run_dir).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from trainspeed.errors import ConfigError
from trainspeed.patches.plan import FLAG_PREFIX, Plan, save_plan
from trainspeed.patches.targets import Targets
from trainspeed.tune.script_facts import DeepSpeedConfigFile
from trainspeed.tune.script_zero_knobs import DS_CONFIG_PREFIX, edited_ds_config
from trainspeed.tune.trials import SubprocessRunner, TrialRequest, TrialResult

FAILED_NOTE = "failed"
"""A patch note starting with this marks the trial failed (a compile that fell back to eager
measures eager code: it must not be read as the compiled speed)."""


def settings_of(request: TrialRequest) -> dict[str, Any]:
    """The request's `key=value` overrides back into a settings dict (values are YAML scalars)."""
    out: dict[str, Any] = {}
    for item in request.overrides:
        key, _, raw = item.partition("=")
        out[key] = yaml.safe_load(raw) if raw else None
    return out


def write_ds_config(settings: dict[str, Any], source: DeepSpeedConfigFile | None, path: Path, *,
                    write: Callable[..., Path] | None = None) -> dict[str, Any]:
    """The settings as a script runs them: their ds_config.* edits written into `path`, a copy
    of the script's DeepSpeed JSON, and the script's own flag (--deepspeed_config) set to that
    copy. The user's file is only read. Settings without such edits come back unchanged.
    Written atomically, or through `write` (a FileSet's: with the tune's other outputs)."""
    edits = {k: v for k, v in settings.items() if k.startswith(DS_CONFIG_PREFIX)}
    if not edits:
        return settings
    if source is None or source.error:
        raise ConfigError(f"settings {', '.join(sorted(edits))} edit the script's DeepSpeed config, but "
                          f"{source.error if source else 'no flag of the script names one'}")
    from trainspeed.fileio import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    (write or atomic_write_text)(path, json.dumps(edited_ds_config(source.config, edits), indent=2) + "\n")
    rest = {k: v for k, v in settings.items() if k not in edits}
    return {**rest, f"{FLAG_PREFIX}{source.option}": str(path)}


CUT_AT = ", cut at "


def shape_parts(shape: str | None) -> tuple[int, int, float | None] | None:
    """(warm-up steps, measured steps, time limit or None) of a stored trial's ScriptRunner.shape;
    None for a shape not written there."""
    if not shape:
        return None
    steps, _, rest = shape.partition(" steps")
    warmup, plus, measured = steps.partition("+")
    if not (plus and warmup.isdigit() and measured.isdigit()):
        return None
    cut = None
    if rest.startswith(CUT_AT):
        try:
            cut = float(rest[len(CUT_AT):].split(" s", 1)[0])
        except ValueError:
            return None
    return int(warmup), int(measured), cut


def sized_steps(shape: str | None) -> tuple[int, int] | None:
    """(warm-up, measured) steps of a stored trial sized to the budget; None for the first
    (pricing) trial, cut by time, or a shape not written by ScriptRunner."""
    parts = shape_parts(shape)
    return parts[:2] if parts is not None and parts[2] is None else None


def first_trial_limit(first: TrialResult | None) -> float | None:
    """The time limit the first (pricing) baseline trial of an earlier tune into this --out ran
    under: a resumed tune asks the same of its first trial, so it is reused whatever the new
    --budget (pricing_seconds grows with it, and word_language_model's first trial ran again)."""
    parts = shape_parts(first.shape) if first is not None and first.ok else None
    return parts[2] if parts is not None else None


def stored_trial_steps(results: Iterable[TrialResult]) -> tuple[int, int] | None:
    """The (warm-up, measured) steps most of `results`, one setting's stored trials, were sized
    to; None where none was (a fresh --out, or only the first trial ran)."""
    counts = Counter(steps for steps in (sized_steps(r.shape) for r in results) if steps is not None)
    return counts.most_common(1)[0][0] if counts else None


@dataclass(kw_only=True)
class ScriptRunner(SubprocessRunner):
    command: list[str]
    """The script's command line (python train.py ARGS), run from the tuner's cwd."""
    warmup_steps: int = 5
    measure_steps: int = 25
    max_seconds: float | None = None
    """Stop a trial once it is this old (after its warm-up and 3 steps): the first baseline
    trial's, which only has to find the step time (trial_fit.pricing_seconds)."""
    count_flops: bool = False
    """Count the FLOPs of one step (the first baseline trial of a tune without --from RUN: the
    baseline's MFU, which a tune reported as "unknown" when its command came from a doctor
    finding, as they all do). Other trials compare step times only: a counted step is one less."""
    longer: dict[str, Any] = field(default_factory=dict)
    """Every trial's run-length flag, set longer than the script's own (args.--max_iters: 406)
    where the script ends before a trial's steps; never part of a setting or best.yaml."""
    targets: Targets = field(default_factory=Targets)
    """Where the patches apply; set from the baseline trial's run (or --from RUN_DIR)."""
    flag_styles: dict[str, str] = field(default_factory=dict)
    deepspeed_config: DeepSpeedConfigFile | None = None
    """The script's DeepSpeed config JSON (set from the baseline's run): ds_config.* settings
    run as an edited copy of it beside the trial's plan."""

    @property
    def shape(self) -> str:
        """What a trial is asked to run now ("5+25 steps", "1+8 steps, cut at 12 s"): a tune
        reuses a stored trial only of the shape its own trials have (Tuner.trial)."""
        cut = f"{CUT_AT}{self.max_seconds:g} s" if self.max_seconds else ""
        run = "".join(f", {k.removeprefix('args.')}={v}" for k, v in self.longer.items())
        return f"{self.warmup_steps}+{self.measure_steps} steps{cut}{run}"

    def plan_path(self, request: TrialRequest) -> Path:
        return self.out_dir / ".plans" / f"{request.key}.yaml"

    def arguments(self, request: TrialRequest) -> list[str]:
        path = self.plan_path(request)
        path.parent.mkdir(parents=True, exist_ok=True)
        settings = write_ds_config({**self.longer, **settings_of(request)}, self.deepspeed_config,
                                   path.with_suffix(".deepspeed.json"))
        save_plan(Plan(command=self.command, settings=settings, targets=self.targets,
                       flag_styles=self.flag_styles), path)
        return ["run", "--with", str(path), "--doctor", "--quiet", *([] if self.count_flops else ["--no-flops"]),
                "--steps", str(self.warmup_steps + self.measure_steps),
                "--warmup-steps", str(self.warmup_steps),
                *(["--max-seconds", f"{self.max_seconds:g}"] if self.max_seconds else []),
                "--out", str(self.out_dir / request.name), "--", *self.command]

    def __call__(self, request: TrialRequest) -> TrialResult:
        shape = self.shape
        result = super().__call__(request)
        result.shape = shape
        notes = _patch_notes(Path(result.run_dir)) if result.run_dir else []
        failed = [n for n in notes if n.lower().startswith(FAILED_NOTE)]
        if result.ok and failed:
            result.ok, result.error = False, failed[0]
        return result


def _patch_notes(run_dir: Path) -> list[str]:
    try:
        return list(json.loads((run_dir / "patches.json").read_text(encoding="utf-8")).get("notes") or [])
    except (OSError, ValueError):
        return []


__all__ = ["FAILED_NOTE", "ScriptRunner", "first_trial_limit", "shape_parts", "sized_steps",
           "stored_trial_steps", "settings_of", "write_ds_config"]
