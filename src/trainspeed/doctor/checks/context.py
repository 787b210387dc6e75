"""What a check sees: the run directory, its summary, and the doctor's observations.

Checks are pure functions `(ctx: CheckContext) -> Finding | None`; everything they read comes
from the run directory, so they run on any run later, not only inside the doctor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from trainspeed.doctor.defaults import DEFAULT_STEPS, default_warmup
from trainspeed.telemetry.rundir import RunData

TUNE_KNOBS = {
    "num_workers": "num_workers",
    "pin_memory": "pin_memory",
    "persistent_workers": "persistent_workers",
    "prefetch_factor": "prefetch_factor",
    "padding": "dynamic_padding",
    "dynamic_padding": "dynamic_padding",
    "bucketing": "bucketing",
    "precision": "precision",
    "compile": "compile",
    "fused": "fused_optimizer",
    "fused_optimizer": "fused_optimizer",
    "attention": "attention",
    "channels_last": "channels_last",
    "threads": "threads",
    "batch_size": "batch_size",
    "logging": "log_every",
    "log_every": "log_every",
    "checkpoint": "checkpoint_every",
    "checkpoint_every": "checkpoint_every",
    "zero_stage": "zero_stage",
    "overlap_comm": "overlap_comm",
    "bucket_size": "bucket_size",
}
"""Doctor topic (or script knob name) -> knob of `trainspeed tune CONFIG --knobs` (tune/knobs.py);
topics missing here have no engine knob."""

SCRIPT_TUNE_KNOBS = {
    "num_workers": "num_workers",
    "pin_memory": "pin_memory",
    "persistent_workers": "persistent_workers",
    "prefetch_factor": "prefetch_factor",
    "precision": "precision",
    "compile": "compile",
    "fused": "fused_optimizer",
    "fused_optimizer": "fused_optimizer",
    "threads": "threads",
    "tf32": "tf32",
    "cudnn_benchmark": "cudnn_benchmark",
    "expandable_segments": "expandable_segments",
    "channels_last": "channels_last",
    "attention": "attention",
    "logging": "log_every",
    "log_every": "log_every",
    "checkpoint": "checkpoint_every",
    "checkpoint_every": "checkpoint_every",
    "eval": "eval_every",
    "eval_every": "eval_every",
    "gc": "no_gc",
    "no_gc": "no_gc",
    "zero_stage": "zero_stage",  # an edited copy of the script's --deepspeed_config JSON
    "overlap_comm": "overlap_comm",
    "bucket_size": "bucket_size",
    "package_lookups": "package_lookups",  # runtime.cache_checks: functools.cache of a library's check
    "padding_flag": "padding",  # the script's own padding flag (--pad_to_max_length, --group_by_length)
}
"""Doctor topic (or knob name) -> knob of `trainspeed tune --knobs K -- CMD` (the SCRIPT tuner's
names, tune/script_knobs.py; log_every, checkpoint_every and no_gc are what-ifs there when the
script has no flag for them). Topics missing here (padding without a flag for it, batch size) are
code changes no run-time setting makes: a script run's finding re-runs the doctor on its command
instead."""

PLAN_SETTING_KNOBS = {
    "loader.num_workers": "num_workers", "loader.pin_memory": "pin_memory",
    "loader.persistent_workers": "persistent_workers", "loader.prefetch_factor": "prefetch_factor",
    "precision": "precision", "compile": "compile", "channels_last": "channels_last", "optimizer.impl": "fused_optimizer",
    "threads": "threads", "cuda.tf32": "tf32", "cuda.cudnn_benchmark": "cudnn_benchmark",
    "cuda.expandable_segments": "expandable_segments", "runtime.cache_checks": "package_lookups",
    "hf.attn_implementation": "attention",
}
"""A `run --with best.yaml` setting -> the script knob that measures it (tune/script_knobs.py)."""


def plan_knobs(plan: Any) -> list[str]:
    """The script knobs of the settings a recorded `run --with` plan applied (runner.py's record)."""
    settings = plan.get("settings") if isinstance(plan, dict) else None
    return [PLAN_SETTING_KNOBS[k] for k in settings or () if k in PLAN_SETTING_KNOBS]


BUDGET_MARGIN = 1.2
"""Room above budget_to_measure in a suggested --budget: trials start processes and run on a
machine that varies (nanoGPT's steps took 9.8 s in the doctor's run and 12.2 s in the tune's
first trial, minutes later)."""


def _knobs(topics: tuple[str, ...], table: dict[str, str]) -> str:
    out: list[str] = []
    for topic in topics:
        knob = table.get(topic)
        if knob and knob not in out:
            out.append(knob)
    return ",".join(out)


def tune_command(*topics: str, command: list[str] | None = None, config: str | None = None,
                 budget: Callable[[list[str]], str] | None = None) -> str | None:
    """The command that measures the fix, or None when no knob covers the topics: for a script
    run, the script tune of the recorded command (`trainspeed tune --knobs K -- python train.py
    ARGS`, shell-quoted, with the ` --budget Nm` that `budget` gives for the knobs where the
    default cannot measure them); for an engine run, the tune of its config (CONFIG.yaml when
    unknown)."""
    import shlex

    if command:
        knobs = _knobs(topics, SCRIPT_TUNE_KNOBS)
        size = budget(knobs.split(",")) if budget and knobs else ""
        return f"trainspeed tune --knobs {knobs}{size} -- {shlex.join(command)}" if knobs else None
    knobs = _knobs(topics, TUNE_KNOBS)
    return f"trainspeed tune {shlex.quote(config) if config else 'CONFIG.yaml'} --knobs {knobs}" if knobs else None


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}" if x >= 0.01 else f"{x:.1%}"


def ms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


@dataclass(kw_only=True, slots=True)
class CheckContext:
    run: RunData
    """The run directory as read."""
    summary: dict[str, Any]
    """`summarize(run)` (see the shared contract)."""
    observations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Observation events grouped by their "kind" (each a dict of fields)."""

    @classmethod
    def from_run(cls, run: RunData, summary: dict[str, Any]) -> "CheckContext":
        grouped: dict[str, list[dict[str, Any]]] = {}
        for event in run.events_of("observation"):
            data = dict(event.get("data") or {})
            kind = data.pop("kind", None)
            if isinstance(kind, str):
                grouped.setdefault(kind, []).append(data)
        return cls(run=run, summary=summary or {}, observations=grouped)

    # ---------------------------------------------------------------- commands
    @property
    def command(self) -> list[str] | None:
        """The script's command line, when the doctor ran it (an engine run has a config)."""
        command = (self.run.config or {}).get("command")
        return [str(c) for c in command] if isinstance(command, list) and command else None

    @property
    def plan(self) -> dict[str, Any] | None:
        """{"path", "settings"} of the best.yaml a `trainspeed run --with PATH --doctor` applied
        (doctor/runner.py), else None."""
        plan = (self.run.config or {}).get("plan")
        return plan if isinstance(plan, dict) and plan.get("path") else None

    @property
    def launcher(self) -> list[str] | None:
        """The launcher words typed before the script (`accelerate launch --num_processes 2`),
        recorded by the doctor that ran under it (doctor/runner.py LAUNCHER_ENV)."""
        words = (self.run.config or {}).get("launcher")
        return [str(w) for w in words] if isinstance(words, list) and words else None

    @property
    def engine_run(self) -> bool:
        """A run of trainspeed's own engine (`trainspeed train CONFIG`, a built-in recipe, a
        Trainer): advice names the config key, never "your own code"."""
        return not self.command and bool((self.first("device") or {}).get("engine"))

    @property
    def pythonpath(self) -> str | None:
        """The PYTHONPATH entries the script's imports came from (`.` for a checkout's own
        package), which every command for this script must carry (instrument/import_path.py)."""
        return (self.first("doctor") or {}).get("pythonpath")

    @property
    def env(self) -> dict[str, str]:
        """The variables that change how torch or the script runs (TORCH_*, CUDA_VISIBLE_DEVICES,
        ...) as the doctor started (instrument/run_env.py): a command without them can crash
        where the user's run did not."""
        env = (self.first("doctor") or {}).get("env")
        return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}

    def with_pythonpath(self, command: str, first: str | None = None, env: dict[str, str] | None = None) -> str:
        """`command` run with the script's PYTHONPATH entries (`first` before them) and its
        variables (`env` over them: a finding's own fix, named once), as typed."""
        from trainspeed.doctor.instrument.import_path import prefixed

        return prefixed(command, first, self.pythonpath, env={**self.env, **(env or {})})

    def doctor_command(self, steps: int | None = None, flags: Sequence[str] = (), path: str | None = None,
                       warmup: int | None = None, no_flops: bool = False, env: dict[str, str] | None = None) -> str:
        """`trainspeed doctor -- <the recorded command>`: runnable as written (with the
        PYTHONPATH entries the script needed, `path` before them). An engine run (a config.yaml,
        no command) is re-run with `trainspeed train` under a new run name, which writes the same
        report. `flags` (`--print-freq 50`) are set in the command in place of the ones it has:
        appended, the script's own earlier value was left beside the fix."""
        import shlex

        from trainspeed.patches.plan import command_with_flags

        config = self.run.path / "config.yaml"
        ranks = len(self.summary.get("ranks") or [])  # a data-parallel run: launched again alike
        if self.first("spawned_trainers"):
            ranks = 0  # the script starts its training processes itself (doctor/spawned.py)
        length = self._steps_option(steps) + self._warmup_option(warmup) + (" --no-flops" if no_flops else "")
        if self.launcher and self.command:  # `accelerate launch ...` as typed: the doctor goes in under it
            fixed = command_with_flags(list(self.command), list(flags))
            return self.with_pythonpath(
                f"trainspeed doctor{length} -- {shlex.join(self.launcher + fixed[1:])}", path, env)
        launch = f"torchrun --nproc_per_node {ranks} -m trainspeed" if ranks > 1 else "trainspeed"
        if not self.command and config.is_file():
            return (f"{launch} train {shlex.quote(str(config))} run.name={self.run.path.name}-after"
                    + (f" run.max_steps={steps}" if steps else ""))
        cmd = shlex.join(command_with_flags(list(self.command or ["python", "train.py"]), list(flags)))
        if self.plan and ranks <= 1:
            # run again with the settings it ran with (`run --doctor` runs to the end unless told)
            if not self._steps_option(steps) and steps != 0:
                length = f" --steps {steps or DEFAULT_STEPS}{length}"
            return self.with_pythonpath(
                f"trainspeed run --with {shlex.quote(self.plan['path'])} --doctor{length} -- {cmd}", path, env)
        # Ranks must agree on one directory (--out is required under torchrun): a new one
        # beside this run's, so the comparison keeps both.
        out = f" --out {shlex.quote(str(self.run.path) + '-after')}" if ranks > 1 else ""
        return self.with_pythonpath(f"{launch} doctor{length}{out} -- {cmd}", path, env)

    def _warmup_option(self, warmup: int | None) -> str:
        """` --warmup-steps N`: `warmup` when a check asks for one, else the run's own when it was
        chosen (--warmup-steps, not the default for the run's length), so the rerun measures alike."""
        if warmup is None:
            doctor = self.first("doctor") or {}
            if "max_steps" not in doctor:
                return ""
            given = self.run.start_data().get("warmup_steps")
            if not isinstance(given, int) or given == default_warmup(doctor["max_steps"]):
                return ""
            warmup = given
        return f" --warmup-steps {warmup}"

    def _steps_option(self, steps: int | None) -> str:
        """` --steps N`: `steps` when a check asks for a length, else the length this run was
        given (`trainspeed doctor --steps 40 ...` is verified over 40 steps, not the default
        200; a run to the script's end, --steps 0, again to its end)."""
        if steps is None:
            doctor = self.first("doctor") or {}
            if "max_steps" not in doctor:
                return ""
            steps = doctor["max_steps"] or 0  # recorded as None: to the script's end
        return "" if steps == DEFAULT_STEPS else f" --steps {steps}"

    def tune_command(self, *topics: str) -> str | None:
        """The one place checks get their `verify_with` tune command from: the tune that
        measures a fix on this run's own script (the recorded command, the script tuner's knob
        names) or config. A topic without a script knob (padding, batch size) re-runs the
        doctor on the command, after the change the finding describes; an engine topic without
        a knob gives None."""
        if self.command:
            command = self.command
            # A tune's trials are one process: accelerate's one-process form; under torchrun the
            # script itself, which the doctor runs as rank 0 of 1.
            if self.launcher and self.launcher[0].rsplit("/", 1)[-1] == "accelerate":
                from trainspeed.doctor.command_words import one_process_launch

                several = len(self.summary.get("ranks") or []) > 1
                command = (one_process_launch(self.launcher) if several else self.launcher) + command[1:]
            if self.plan:  # the tune starts from the script as it is: measure the applied settings too
                topics = (*plan_knobs(self.plan), *topics)
            tune = tune_command(*self._script_measures(topics), command=command, budget=self._budget_option)
            return self.with_pythonpath(tune) if tune else f"{self.doctor_command()} (after the change)"
        config = self.run.path / "config.yaml"
        return tune_command(*topics, config=str(config) if config.is_file() else None)

    def _script_measures(self, topics: tuple[str, ...]) -> tuple[str, ...]:
        """`topics` less those whose script knob this script gives its trials nothing to vary:
        the tune's eval_every sets the script's own eval-interval flag (a positive int) and skips
        a script without one, so pytorch/examples' super_resolution (a test() after every
        epoch, no flag) was told `trainspeed tune --knobs eval_every -- ...`, which measured
        nothing ("the script has no eval-interval flag"). Its change is to the code: the doctor
        verifies it."""
        from trainspeed.doctor.checks.script_flags import script_flag

        if not any(SCRIPT_TUNE_KNOBS.get(t) == "eval_every" for t in topics):
            return topics
        value = (script_flag(self, "eval_interval") or {}).get("value")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return topics
        return tuple(t for t in topics if SCRIPT_TUNE_KNOBS.get(t) != "eval_every")

    def _budget_option(self, knobs: list[str]) -> str:
        """` --budget Nm --from RUN` where the tune's default budget cannot measure one setting of each of
        `knobs` and verify a winner at this run's step time, its first step's one-time costs
        on every trial's warm-up (trial_fit.budget_to_measure, plus BUDGET_MARGIN), else "": a
        script of 35 s steps was told to run a 10-minute tune that could measure nothing."""
        import math
        import shlex

        from trainspeed.tune.knob_types import COMPILE_COST_FACTOR
        from trainspeed.tune.options import TuneOptions
        from trainspeed.tune.trial_fit import budget_to_measure

        step_s = (self.summary.get("step_time") or {}).get("p50")
        if not isinstance(step_s, (int, float)) or not step_s > 0:
            return ""
        options = TuneOptions()
        first = (self.run.steps[0] if self.run.steps else {}).get("t_step")
        needed = BUDGET_MARGIN * budget_to_measure(
            float(step_s), self._start_s(), [COMPILE_COST_FACTOR if k == "compile" else 1.0 for k in knobs],
            first_step_s=float(first) if isinstance(first, (int, float)) else 0.0,
            repeats=options.repeats, every=options.baseline_every, verify=options.verify_repeats)
        if needed <= options.budget_s:
            return ""
        # --from: the tune's first trial then counts no FLOPs (this run's count gives the MFU),
        # where a count could cost several slow steps
        run = self.run.path if self.run.path.name else self.run.path.resolve()
        return f" --budget {math.ceil(needed / 60)}m --from {shlex.quote(str(run))}"

    def _start_s(self) -> float:
        """Seconds from the run's start to its first step's start (the script's own start-up)."""
        starts = self.run.events_of("run_start")
        start = starts[0].get("t_wall") if starts else None
        first = self.run.steps[0] if self.run.steps else {}
        wall, step = first.get("t_wall"), first.get("t_step")
        if not all(isinstance(x, (int, float)) for x in (start, wall, step)):
            return 0.0
        return max(0.0, wall - step - start)

    # ---------------------------------------------------------------- observations
    def obs(self, kind: str) -> list[dict[str, Any]]:
        return self.observations.get(kind, [])

    def first(self, kind: str) -> dict[str, Any] | None:
        found = self.observations.get(kind)
        return found[0] if found else None

    def train_loader(self) -> dict[str, Any] | None:
        loaders = self.obs("dataloader")
        for loader in loaders:
            if loader.get("role") == "train":
                return loader
        return loaders[0] if loaders else None

    def primary_optimizer(self) -> dict[str, Any] | None:
        opts = self.obs("optimizer")
        for opt in opts:
            if opt.get("primary"):
                return opt
        return opts[0] if opts else None

    def models(self) -> list[dict[str, Any]]:
        """The trained models: modules with parameters seen in a training forward, those an
        optimizer updates first (never a parameter-free transform or loss module)."""
        models = [m for m in self.obs("model") if m.get("params") != 0]
        return sorted(models, key=lambda m: not m.get("trained_by"))

    @staticmethod
    def optimizer_label(opt: dict[str, Any]) -> str:
        """`optimizerD (Adam over Discriminator)`: the optimizer as the script names it, and
        what it updates."""
        cls, name, updates = opt.get("class") or "optimizer", opt.get("name"), opt.get("updates") or []
        over = f" over {', '.join(updates)}" if updates else ""
        return f"{name} ({cls}{over})" if name and name != cls else f"{cls}{over}"

    @property
    def precision(self) -> str:
        """The precision the run trained in (the summary's: fp32, bf16-mixed, fp64 ...)."""
        return str(self.summary.get("precision") or "fp32")

    @property
    def device_type(self) -> str:
        device = self.first("device")
        if device and device.get("type"):
            return str(device["type"])
        return str(self.summary.get("device") or "cpu").split(":")[0]

    @property
    def cores(self) -> int:
        device = self.first("device") or {}
        loader = self.train_loader() or {}
        return int(device.get("cores") or loader.get("cores") or 1)

    # ---------------------------------------------------------------- numbers
    def share(self, phase: str) -> float:
        info = (self.summary.get("phases") or {}).get(phase) or {}
        value = info.get("share")
        return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else 0.0

    def phase_mean(self, phase: str) -> float | None:
        info = (self.summary.get("phases") or {}).get(phase) or {}
        value = info.get("mean_s")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def step_mean(self) -> float | None:
        value = (self.summary.get("step_time") or {}).get("mean")
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    @property
    def steps(self) -> int:
        """Step records in the run (warm-up included)."""
        return len(self.run.steps)

    @property
    def total_time(self) -> float:
        """Seconds of all recorded steps (warm-up included: call-site seconds cover them too)."""
        t = self.run.array("t_step")
        return float(np.nansum(t)) if t.size else 0.0

    def sites(self, category: str, kinds: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """Call-site rows of one category ("sync", "log", "ckpt"), busiest first."""
        rows: list[dict[str, Any]] = []
        for obs in self.obs("call_sites"):
            for row in obs.get("rows") or []:
                if row.get("category") == category and (kinds is None or row.get("kind") in kinds):
                    rows.append(row)
        rows.sort(key=lambda r: (-(r.get("count") or 0), -(r.get("seconds") or 0.0)))
        return rows

    def site_totals(self, category: str) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for obs in self.obs("call_sites"):
            for kind, tot in ((obs.get("totals") or {}).get(category) or {}).items():
                acc = out.setdefault(kind, {"count": 0, "seconds": 0.0})
                acc["count"] += tot.get("count") or 0
                acc["seconds"] += tot.get("seconds") or 0.0
        return out

    def time_share(self, seconds: float) -> float:
        total = self.total_time
        return seconds / total if total > 0 else 0.0


def describe_site(row: dict[str, Any]) -> str:
    """"`loss.item()` at train.py:42" (or just the site when the source is unknown); a call made
    inside a library the line called into (DeepSpeed) names that library's line beside it:
    "`engine.step()` at train.py:42 (inside deepspeed/runtime/engine.py:2203)"."""
    code = row.get("code")
    text = f"`{code}` at {row.get('site')}" if code else str(row.get("site"))
    return f"{text} (inside {row['via']})" if row.get("via") else text
