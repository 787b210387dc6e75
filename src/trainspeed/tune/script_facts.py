"""What the script tuner knows about an unchanged script: read from a doctor run directory
(the baseline trial's, or the one `--from RUN_DIR` names).

The doctor records where the training DataLoader and the primary optimizer were built, where
the loop calls the trained module, the script's argparse flags, and the call sites of logging,
saving and gc. From that the knobs decide what to try, the patches know where to apply, and
the code change knows which line to edit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainspeed.doctor.checks.context import CheckContext
from trainspeed.doctor.checks.lookups import per_step_checks
from trainspeed.doctor.checks.script_flags import find_flag
from trainspeed.patches.targets import Targets
from trainspeed.telemetry.env import expandable_segments_on
from trainspeed.telemetry.rundir import read_run
from trainspeed.telemetry.summary import flops_per_step, peak_of

# Knob -> the doctor's flag topic (checks/script_flags.TOPIC_FLAGS holds the flag names):
# a trial passes the script's own flag instead of patching behind its back.
KNOB_TOPICS = {"num_workers": "num_workers", "compile": "compile", "log_every": "log_interval",
               "checkpoint_every": "checkpoint_interval", "eval_every": "eval_interval"}

DEEPSPEED_CONFIG_FLAGS = ("deepspeed_config", "deepscale_config", "deepspeed")
"""Flags (argparse dests) that name a DeepSpeed config JSON, in order of preference:
deepspeed.add_config_arguments' --deepspeed_config (--deepscale_config is its old name; its
--deepspeed is a bare switch), and Hugging Face TrainingArguments' --deepspeed ds_config.json."""


@dataclass(frozen=True, slots=True)
class DeepSpeedConfigFile:
    """The DeepSpeed config JSON the script is given on its command line."""

    option: str
    """The flag that names it (--deepspeed_config): a trial passes a copy through it."""
    path: str
    """The file as the flag names it, resolved from the tuner's working directory (the script's)."""
    config: dict[str, Any] = field(default_factory=dict)
    """Its settings (empty when it could not be read: then `error` says why)."""
    error: str | None = None


def deepspeed_config_file(flags: list[dict[str, Any]], cwd: Path | None = None) -> DeepSpeedConfigFile | None:
    """The script's flag that names a DeepSpeed config JSON (DEEPSPEED_CONFIG_FLAGS) with its
    contents, or None when no flag names a file (a bare --deepspeed switch, a config dict built
    in the code)."""
    import json

    rows = [r for r in flags if isinstance(r, dict) and isinstance(r.get("value"), str) and r.get("value")]
    for dest in DEEPSPEED_CONFIG_FLAGS:
        for row in rows:
            if str(row.get("dest") or "").lower() != dest:
                continue
            path = Path(row["value"]).expanduser()
            path = path if path.is_absolute() else (cwd or Path.cwd()) / path
            option = str(row.get("option") or f"--{dest}")
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                return DeepSpeedConfigFile(option=option, path=str(path),
                                           error=f"{option} {row['value']}: not a readable JSON file ({exc})")
            if not isinstance(data, dict):
                return DeepSpeedConfigFile(option=option, path=str(path),
                                           error=f"{option} {row['value']}: holds a {type(data).__name__}, not an object")
            return DeepSpeedConfigFile(option=option, path=str(path), config=data)
    return None


@dataclass(kw_only=True)
class ScriptFacts:
    targets: Targets
    loader: dict[str, Any] | None = None
    """The training DataLoader's settings as the doctor saw them (None: no DataLoader)."""
    optimizer: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    flags: list[dict[str, Any]] = field(default_factory=list)
    """The script's own flags (option, dest, value, default, type, kind)."""
    device: str = "cpu"
    cores: int = 1
    log_calls: int = 0
    """Logging calls (print, SummaryWriter, wandb) per run, as counted by the doctor."""
    save_calls: int = 0
    gc_calls: int = 0
    steps: int = 0
    findings: list[dict[str, Any]] = field(default_factory=list)
    """The doctor's findings on the script, when the run has a report."""
    deepspeed: dict[str, Any] | None = None
    """The DeepSpeed engine the doctor saw at its first step (zero_stage, overlap_comm, ...;
    doctor/instrument/deepspeed.py); None: the script runs no DeepSpeed engine."""
    deepspeed_config: DeepSpeedConfigFile | None = None
    """The DeepSpeed config JSON its command line names (None: none does)."""
    flops_per_step: float | None = None
    """The doctor's FLOP count of one step (trials count none: it would slow a step of each)."""
    peak: tuple[float | None, str | None] = (None, None)
    """The peak FLOP/s that MFU is relative to, and its name."""
    lookup_checks: list[str] = field(default_factory=list)
    """`module.function` of the library package checks the doctor saw asked at every step
    (doctor/checks/lookups.py): what the package_lookups knob caches."""
    phase_shares: dict[str, float] = field(default_factory=dict)
    """The baseline's phases as shares of its measured steps (logging, checkpointing, ...; empty
    when its report had none): what thinning a phase's calls can win at most."""
    expandable_segments: bool = False
    """Whether the run's PYTORCH_CUDA_ALLOC_CONF already turned expandable segments on."""
    modules: tuple[str, ...] = ()
    """The installed libraries' modules the script imported (doctor/instrument/imported.py):
    what the tune's fork server imports once instead of every trial."""

    def flag_for(self, topic: str) -> dict[str, Any] | None:
        """The script's flag that holds knob `topic` (num_workers, compile, ...), if it has one."""
        return find_flag(self.flags, KNOB_TOPICS.get(topic, topic))

    def run_steps(self) -> tuple[dict[str, Any] | None, int | None]:
        """The script's run-length flag and its value when it counts steps (--max_iters=60);
        the value is None for epochs, or without such a flag."""
        run = self.flag_for("run_length")
        value = run.get("value") if run else None
        if run is None or isinstance(value, bool) or not isinstance(value, int) or "epoch" in str(run.get("option")):
            return run, None
        return run, value


def _site(path: Any) -> tuple[str, int] | None:
    if isinstance(path, (list, tuple)) and len(path) == 2 and path[0]:
        return str(path[0]), int(path[1])
    return None


def _sites_of(ctx: CheckContext, category: str, kinds: tuple[str, ...] | None = None) -> tuple[tuple[str, int], ...]:
    """The (file, line) of each call site of a category the doctor counted (`site_path`) more
    than once: a what-if keeps every site's first call, so a call made once (makemore's
    set-up prints) is one no edit needs to change."""
    found = [site for row in ctx.sites(category, kinds)
             if (row.get("count") or 0) > 1 and (site := _site(row.get("site_path")))]
    return tuple(dict.fromkeys(found))


def _trained_model(ctx: CheckContext) -> dict[str, Any] | None:
    """The module the loss comes from: the biggest observed module with parameters (the loss
    module, called next to it, has none)."""
    models = [m for m in ctx.models() if (m.get("params") or 0) > 0]
    return max(models, key=lambda m: m.get("params") or 0) if models else None


def _trained_classes(ctx: CheckContext, model: dict[str, Any] | None) -> tuple[str, ...]:
    """Every trained module's class, the trained model's first: those an optimizer updates,
    or, where no optimizer's parameters were matched to a module, every module with parameters."""
    models = [m for m in ctx.models() if (m.get("params") or 0) > 0 and m.get("class")]
    trained = [m for m in models if m.get("trained_by")] or models
    first = [model["class"]] if model and model.get("class") else []
    return tuple(dict.fromkeys(first + [m["class"] for m in trained]))


def _optimizer_sites(ctx: CheckContext, primary: dict[str, Any] | None) -> dict[str, tuple]:
    """Where each optimizer that stepped is built (the doctor observes one at its first step),
    the primary's first, as Targets' fields: optimizer_sites, each site once (one optimizer's
    alone is the primary's site), and optimizer_build_sites/_classes, one entry per optimizer
    of a known class."""
    opts = sorted(ctx.obs("optimizer"), key=lambda o: o is not primary)
    built = [(site, o.get("class")) for o in opts if (site := _site(o.get("site_path"))) is not None]
    if len(built) < 2:
        return {}
    known = [(site, str(cls)) for site, cls in built if cls]
    return {"optimizer_sites": tuple(dict.fromkeys(site for site, _ in built)),
            "optimizer_build_sites": tuple(site for site, _ in known) if len(known) > 1 else (),
            "optimizer_build_classes": tuple(cls for _, cls in known) if len(known) > 1 else ()}


def read_facts(run_dir: str | Path) -> ScriptFacts:
    """ScriptFacts of a doctor run directory (raises RunDirError if it is not one)."""
    import json

    run = read_run(run_dir)
    summary: dict[str, Any] = {}
    findings: list[dict[str, Any]] = []
    report = Path(run_dir) / "report.json"
    if report.is_file():
        try:
            data = json.loads(report.read_text(encoding="utf-8"))
            summary, findings = data.get("summary") or {}, data.get("findings") or []
        except (OSError, ValueError):
            pass
    ctx = CheckContext.from_run(run, summary)
    loader = ctx.train_loader()
    opt = ctx.primary_optimizer()
    model = _trained_model(ctx)
    flags_obs = ctx.first("script_flags") or {}
    totals = {cat: ctx.site_totals(cat) for cat in ("log", "ckpt", "sync")}
    script = None
    command = (run.config or {}).get("command") or []
    if command:
        from trainspeed.doctor.runner import parse_command

        try:
            target = parse_command(command)
            if target.kind == "path":
                script = str(Path(target.name).resolve())
        except Exception:  # noqa: BLE001 - the script may have moved since; targets stay usable
            pass
    targets = Targets(
        script=script,
        loader_site=_site((loader or {}).get("site_path")),
        optimizer_site=_site((opt or {}).get("site_path")),
        optimizer_class=(opt or {}).get("class"),
        **_optimizer_sites(ctx, opt),
        model_class=(model or {}).get("class"),
        model_call_site=_site((model or {}).get("call_site_path")),
        trained_classes=_trained_classes(ctx, model),
        autocast=(model or {}).get("autocast"),
        compiled=bool((model or {}).get("compiled")),
        convolutional=bool((model or {}).get("convolutional")),
        hf_model=bool((model or {}).get("hf_model")),
        framework=(ctx.first("framework") or {}).get("name"),
        save_sites=_sites_of(ctx, "ckpt"), log_sites=_sites_of(ctx, "log"),
        gc_sites=_sites_of(ctx, "sync", ("gc_collect", "empty_cache")),
    )
    return ScriptFacts(
        targets=targets, loader=loader, optimizer=opt, model=model,
        flags=list(flags_obs.get("flags") or []), device=ctx.device_type, cores=ctx.cores,
        log_calls=int(sum(t.get("count") or 0 for t in totals["log"].values())),
        save_calls=int(sum(t.get("count") or 0 for t in totals["ckpt"].values())),
        gc_calls=int(sum((totals["sync"].get(k) or {}).get("count") or 0 for k in ("gc_collect", "empty_cache"))),
        steps=ctx.steps, findings=findings, deepspeed=ctx.first("deepspeed"),
        deepspeed_config=deepspeed_config_file(list(flags_obs.get("flags") or [])),
        flops_per_step=flops_per_step(run), peak=peak_of(run), lookup_checks=per_step_checks(ctx),
        modules=tuple((ctx.first("imports") or {}).get("library") or ()),
        phase_shares={name: float(p["share"]) for name, p in (summary.get("phases") or {}).items()
                      if isinstance(p, dict) and isinstance(p.get("share"), (int, float))},
        expandable_segments=expandable_segments_on((run.env or {}).get("alloc_conf")
                                                   if isinstance(run.env, dict) else None),
    )


__all__ = ["DEEPSPEED_CONFIG_FLAGS", "KNOB_TOPICS", "DeepSpeedConfigFile", "ScriptFacts",
           "deepspeed_config_file", "read_facts"]
