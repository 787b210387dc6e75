"""`trainspeed tune [OPTIONS] -- python train.py ARGS` end to end: tune an unchanged script.

The same measured search as a recipe tune (search.Tuner: fresh process per trial, warm-up
excluded, interleaved repeats, baseline between candidates, noise-aware verdicts, loss
parity, greedy combination, final verification), with the script knobs (script_knobs.py)
applied by trainspeed.patches at run time. The baseline trial is a doctor run of the
unchanged script: it tells the knobs what the script does and the patches where to apply.

    <out>/trials/        one doctor run directory per trial
    <out>/tune.jsonl     finished trials (rerun with the same --out to resume)
    <out>/tune.json|md|html   the tables
    <out>/best.yaml      the winning settings: `trainspeed run --with <out>/best.yaml -- CMD`
    <out>/code_change.md, best.patch   where each kept setting goes in your files
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import statistics
from pathlib import Path
from typing import Any, Callable

from trainspeed.doctor.instrument.import_path import with_own_env
from trainspeed.doctor.tuned import record_tune, script_key
from trainspeed.errors import ConfigError
from trainspeed.patches.plan import FLAG_PREFIX
from trainspeed.patches.targets import Targets
from trainspeed.patches.whatif_code import CODE_PREFIX, whatif_of
from trainspeed.tune.knob_types import DEFAULT_WARMUP, PERIODS_PER_TRIAL
from trainspeed.tune.knobs import DeviceInfo
from trainspeed.tune.options import TuneOptions
from trainspeed.tune.progress import ProgressPrinter
from trainspeed.tune.result import TuneResult, threads_under_load_note
from trainspeed.tune.script_facts import ScriptFacts, read_facts
from trainspeed.tune.script_knobs import BOOL_TYPES, SCRIPT_KNOBS, ScriptContext, is_whatif, knobs_from_findings
from trainspeed.tune.script_trials import ScriptRunner, first_trial_limit, stored_trial_steps, write_ds_config
from trainspeed.tune.search import Tuner, config_key
from trainspeed.tune.session import output_set, run_then_close
from trainspeed.tune.stakes import mark_stakes, order_by_stake, order_line
from trainspeed.tune.store import TrialStore
from trainspeed.tune.trial_fit import PRICING_WARMUP, fit_trial, pricing_seconds, trial_length_line
from trainspeed.tune.trials import Runner, TrialResult


DS_CONFIG_FILE = "deepspeed_config.json"
"""The tuned copy of the script's DeepSpeed config, next to best.yaml (a ZeRO setting won)."""

MIN_MEASURED_STEPS = 25
MIN_MEASURED_S = 4.0
"""A script trial measures at least this long (the baseline's step time sets the step count):
a 25-step trial of a 50 ms step lasted 1.3 s, and one neighbour's burst decided it."""
MAX_MEASURED_STEPS = 400


def trial_steps(step_s: float) -> int:
    """Measured steps per trial for steps of `step_s` seconds (see MIN_MEASURED_S)."""
    if step_s <= 0:
        return MIN_MEASURED_STEPS
    return int(min(MAX_MEASURED_STEPS, max(MIN_MEASURED_STEPS, math.ceil(MIN_MEASURED_S / step_s))))


def quiet_step_time(step_times: list[float]) -> float:
    """The step time that sets the trial length: the 10th percentile, not the median. A
    neighbour's burst during the one baseline run inflated makemore's median 7x (158 ms for
    22 ms steps), and trials of 26 steps lasted 1.5 s on a quiet machine: too short to judge."""
    ordered = sorted(t for t in step_times if t > 0)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(0.1 * len(ordered)))]


def command_hash(command: list[str]) -> str:
    """Identity of the tuned command (and where it runs): a resumed tune finds its trials."""
    blob = json.dumps({"command": command, "cwd": os.getcwd()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def flag_styles(facts: ScriptFacts) -> dict[str, str]:
    """How each of the script's flags is written: `--x=1` for argv-read (nanoGPT) flags, bare
    for store_true switches, negated for store_false ones (`--no_x` sets x False), `--x 1`
    otherwise."""
    styles: dict[str, str] = {}
    for flag in facts.flags:
        kind = flag.get("kind")
        # A `--x [BOOL]` flag (HfArgumentParser's bool fields: nargs="?", const=True) is written
        # `--x False`: left out, a field whose default is True (run_glue.py's pad_to_max_length)
        # stays on. A bare flag with another const (timm's --torchcompile) is written bare.
        bare = kind == "storetrue" or (flag.get("bare_value") is not None and flag.get("type") not in BOOL_TYPES)
        styles[str(flag["option"])] = ("equals" if kind == "equals" else "negated" if kind == "storefalse"
                                       else "bare" if bare else "space")
    return styles


def describe_settings(settings: dict[str, Any], styles: dict[str, str] | None = None) -> str:
    """`--log-every 10, loader.num_workers=2`: the script's flags as typed (in their `styles`:
    llama2.c's `--compile=True`, which `--compile True` would not run), patches as keys, a
    what-if verified as best.patch's edit as `whatif.save_every=4 as code (best.patch)`."""
    from trainspeed.patches.plan import flag_style, render_flag

    def flag(option: str, value: Any) -> str:
        return " ".join(render_flag(option, value, flag_style(option, styles, []))) or f"{option} off"

    def patch(key: str, value: Any) -> str:
        if key.startswith(CODE_PREFIX):
            return f"{whatif_of(key)}={value} as code (best.patch)"
        if isinstance(value, list):  # runtime.cache_checks: the names, not a Python list's repr
            return f"{key}={','.join(map(str, value))}"
        return f"{key}={value}"

    flags = [flag(k[len(FLAG_PREFIX):], v) for k, v in sorted(settings.items()) if k.startswith(FLAG_PREFIX)]
    return ", ".join(flags + [patch(k, v) for k, v in sorted(settings.items()) if not k.startswith(FLAG_PREFIX)])


def order_knobs(knobs: list[str], facts: ScriptFacts | None) -> list[str]:
    """The knobs the doctor's findings name first (largest share at stake first), then the rest."""
    if facts is None or not facts.findings:
        return knobs
    return order_by_stake(knobs, facts.findings)


def run_script_tune(command: list[str], out_dir: str | Path, options: TuneOptions, *,
                    warmup_steps: int = DEFAULT_WARMUP, measure_steps: int | None = None, from_run: str | Path | None = None,
                    runner: Runner | None = None, say: Callable[[str], None] | None = None,
                    trial_timeout_s: float = 600.0) -> TuneResult:
    from trainspeed.doctor.runner import parse_command

    if say is None:
        say = ProgressPrinter()  # folded to the terminal's width, or a log's (progress.py)
    parse_command(command)  # a missing script is a ConfigError now, not a failed baseline
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prior = read_facts(from_run) if from_run is not None else None
    if prior is not None:
        said = order_line(options.knobs, prior.findings, f"{from_run}'s findings")
        options.knobs = order_knobs(options.knobs, prior)
        say(f"{said}; knobs in this order: {', '.join(options.knobs)}")
    base_hash = command_hash(list(command))
    store = TrialStore(out)
    if len(store):
        say(f"resuming: {len(store)} finished trials in {store.path} (those of this command are reused; "
            "another --out starts afresh)")
    if runner is None:
        limit = first_trial_limit(store.get(config_key(base_hash, {}), 0))
        runner = ScriptRunner(base_config=out / "best.yaml", out_dir=out / "trials", command=list(command),
                              measure_steps=measure_steps or MIN_MEASURED_STEPS,
                              timeout_s=trial_timeout_s, fork_server=options.fork_server, say=say,
                              targets=prior.targets if prior else Targets(),
                              max_seconds=limit or pricing_seconds(options.budget_s),
                              warmup_steps=min(warmup_steps, PRICING_WARMUP), count_flops=prior is None)
    state: dict[str, Any] = {"facts": prior, "baseline_memory": None}

    def make_context(settings: dict[str, Any], base: TrialResult | None) -> ScriptContext:
        if base is not None and base.run_dir:
            facts = read_facts(base.run_dir)  # the baseline saw the script as it is now
            counted = prior or state["facts"]  # the FLOP count of --from's run, or of the first baseline trial
            if facts.flops_per_step is None and counted is not None and counted.flops_per_step is not None:
                facts.flops_per_step, facts.peak = counted.flops_per_step, counted.peak
            if prior is not None:
                facts.findings = prior.findings
            elif facts.findings:  # no --from: the baseline trial is the doctor's pass
                say(order_line(options.knobs, facts.findings, "the baseline's findings"))
                options.knobs = order_knobs(options.knobs, facts)
            state["facts"], state["baseline_memory"] = facts, base.memory_peak
            if isinstance(runner, ScriptRunner):
                runner.targets, runner.flag_styles = facts.targets, flag_styles(facts)
                runner.deepspeed_config = facts.deepspeed_config
                runner.preload_more(facts.modules)  # the script's libraries, imported once from now on
            _describe(facts, say)
        facts = state["facts"]
        if facts is None:
            raise ConfigError("the script tune has no facts about the script (no baseline run directory)")
        device = DeviceInfo.detect("cuda" if facts.device == "cuda" else "cpu")
        return ScriptContext(facts=facts, device=device, settings=settings, baseline_memory=state["baseline_memory"])

    doctor = with_own_env(f"trainspeed doctor -- {shlex.join(command)}")
    hint = (f"Run `{doctor}` to see what the script does: it must "
            "reach optimizer steps (a loop without torch.optim can mark each step with one line, "
            "trainspeed.step()).")
    def fit(base: TrialResult, trials: float) -> float:
        """Trials sized to the budget from what the first baseline trial took (trial_fit.py)."""
        runner.max_seconds = None  # only the first baseline trial is cut by time
        runner.count_flops = False  # and counts a step's FLOPs
        first_warmup, runner.warmup_steps = runner.warmup_steps, warmup_steps
        if not base.step_times:
            return base.wall_s
        longest = measure_steps or trial_steps(quiet_step_time(base.step_times))
        length_from = "--steps sets the measured steps"
        periods = tuner.min_measure_steps > longest  # several periods of a log interval (knob_types.py)
        if periods:
            length_from = f"{PERIODS_PER_TRIAL} periods of a setting's interval; a larger --steps measures more"
        # The first baseline trial's cost counts even where a resumed tune reused it (spent 0):
        # the same tune resumed sizes its trials as it did, so their stored repeats are reused.
        stored = stored_trial_steps(store.of_key(tuner.key({})))
        sized = fit_trial(base, warmup_steps, trials, options.budget_s - max(tuner.spent, base.wall_s),
                          max(longest, tuner.min_measure_steps), first_warmup=first_warmup, stored=stored)
        if stored == (sized.warmup_steps, sized.measure_steps):
            length_from = "as the finished trials in this --out ran"
        if periods and sized.measure_steps >= tuner.min_measure_steps:
            say(f"trials measure {tuner.min_measure_steps} steps, not {longest}: {PERIODS_PER_TRIAL} periods "
                "of the longest interval a setting makes")
        elif periods:  # nanoGPT: "trials measure 30 steps", then each trial ran 8
            say(f"a setting's interval asks for trials of {tuner.min_measure_steps} measured steps "
                f"({PERIODS_PER_TRIAL} periods); the budget pays for {sized.measure_steps}: a larger --budget "
                "measures them whole")
            length_from = "the budget sets the measured steps"
        runner.warmup_steps, runner.measure_steps = sized.warmup_steps, sized.measure_steps
        tuner.measure_steps = sized.measure_steps
        say(trial_length_line(base, sized, trials, length_from))
        run_longer(runner, state["facts"], sized.warmup_steps + sized.measure_steps, say)
        return sized.price_s

    def verify_as(best: dict[str, Any]) -> dict[str, Any]:
        """A what-if winner is verified as best.patch's edit made in the source (code.*)."""
        from trainspeed.patches.whatif_code import as_code

        run = as_code(best, code_whatif)
        if run != best:
            state["patched"] = patched_code_lines(run, state["facts"].targets)
            say("the verification runs best.patch's edit of your code in place of the what-if: "
                + "; ".join(state["patched"]))
        return run

    tuner = Tuner(base_config={}, base_hash=base_hash, device=DeviceInfo.detect("cpu"),
                  runner=runner, store=store, options=options, say=say, knob_table=SCRIPT_KNOBS,
                  make_context=make_context, whatif=lambda s: is_whatif(s) and not code_whatif(s),
                  baseline_hint=hint,
                  describe=lambda s: describe_settings(s, flag_styles(state["facts"]) if state.get("facts") else None),
                  fit_trials=fit if isinstance(runner, ScriptRunner) else None, verify_as=verify_as)
    realized: dict[str, bool] = {}

    def code_whatif(settings: dict[str, Any]) -> bool:
        """A what-if best.patch can write as code (patches/whatif_code.py): it may win, since
        the edit does what the measured what-if did; any other is a measurement only."""
        from trainspeed.patches.whatif_code import realizable

        key = json.dumps(settings, sort_keys=True, default=str)
        if key not in realized and state["facts"] is not None:
            realized[key] = realizable(settings, state["facts"].targets)
        return realized.get(key, False)

    result = run_then_close(tuner, runner)
    counted = prior or state["facts"]
    if result.baseline_mfu is None and counted is not None:
        result.baseline_mfu, result.peak_name = doctor_mfu(counted, tuner.results({}))
    for row in result.ablation:
        if is_whatif(row.settings) and row.speedup is not None:
            said = ("what-if: an edit of your code does this (best.patch, if it wins)" if code_whatif(row.settings)
                    else "what-if: the time this costs, measured; not applied")
            row.note = said + ("; " + row.note if row.note else "")
    if state["facts"] is not None:
        mark_stakes(result.ablation, state["facts"].findings)
        if result.final is not None and state.get("patched"):
            say_patched_code(result.final, state["patched"])
    write_script_outputs(command, result, out, state["facts"], runner)
    target = parse_command(command)  # the doctor's next report of this script reads the record
    record_tune(script_key(target.kind, target.name), out, [row.as_dict() for row in result.ablation],
                command=list(command), kept=result.best_settings)
    return result


def run_longer(runner: Any, facts: ScriptFacts | None, steps: int, say: Callable[[str], None]) -> None:
    """Trials of a script whose own run-length flag ends it before `steps` run it longer, through
    that flag: nanoGPT at --max_iters=60 ended every trial after 55 of its 400 measured steps,
    and 0.5 s of steps per trial read 1.0-1.9 ms/sample for one config: nothing could win."""
    if not isinstance(runner, ScriptRunner) or facts is None:
        return
    from trainspeed.doctor.checks.script_flags import set_flag

    flag, value = facts.run_steps()
    if flag is None or value is None or value > steps:
        return
    longer = steps + 1  # a loop `for it in range(max_iters + 1)` or `while it <= max_iters`: either way enough
    runner.longer = {f"args.{flag['option']}": longer}
    say(f"the script stops after {set_flag(flag, value)}: its trials run {set_flag(flag, longer)} to measure "
        f"the steps above (your command keeps {set_flag(flag, value)}; best.yaml and best.patch leave it as it is)")


def patched_code_lines(settings: dict[str, Any], targets: Targets) -> list[str]:
    """What best.patch's edits for the code.* settings do ("train.py:15: the interval on line
    14, 2 -> 8"), or why they cannot be made."""
    from trainspeed.patches.edited_source import edited_texts

    edits = {k: v for k, v in settings.items() if k.startswith(CODE_PREFIX)}
    try:
        return [text for _, text in edited_texts(edits, targets)[1]]
    except (ConfigError, ImportError) as exc:
        return [f"the edit cannot be made ({exc})"]


def say_patched_code(row: Any, patched: list[str]) -> None:
    """The verification row of a what-if winner says it measured the patched code (`patched`:
    what the edits do), or why the patched code was not measured (its trials failed: no
    best.patch on that evidence)."""
    from trainspeed.tune import stats

    if row.verdict == stats.FAILED:
        error = (row.note or "failed").strip().splitlines() or ["failed"]
        why = re.sub(r"^trainspeed: error: (\w+Error: )?", "", error[-1])  # the trial's ConfigError
        row.note = f"not verified: the patched code did not run ({why}); no best.patch"
    elif row.speedup is not None:  # not a row the budget left unmeasured
        row.note = f"measured the patched code (best.patch's edit: {'; '.join(patched)})" + (
            "; " + row.note if row.note else "")


def doctor_mfu(facts: ScriptFacts, baseline: list[TrialResult]) -> tuple[float | None, str | None]:
    """The baseline's MFU from the doctor run's FLOP count and peak (`--from RUN`, else the first
    baseline trial's) at the baseline trials' median measured step, as the doctor computes it
    (the other trials count no FLOPs).
    (None, None) when either is unknown or the reading is impossible."""
    from trainspeed.telemetry.throughput import mfu

    steps = [t for r in baseline if r.ok for t in r.step_times]
    reading = mfu(facts.flops_per_step, statistics.median(steps) if steps else None, *facts.peak)
    return (reading.value, reading.peak_name) if reading.valid else (None, None)


def _describe(facts: ScriptFacts, say: Callable[[str], None]) -> None:
    from trainspeed.doctor.instrument.sites import format_site

    t = facts.targets
    parts = []
    if t.loader_site:
        parts.append(f"training DataLoader at {format_site(*t.loader_site)} "
                     f"(num_workers={(facts.loader or {}).get('num_workers')})")
    if t.model_class:
        others = [c for c in t.trained_classes if c != t.model_class]
        parts.append(f"model {t.model_class}" + (f" called at {format_site(*t.model_call_site)}" if t.model_call_site else "")
                     + (f" (also trained: {', '.join(others)})" if others else ""))
    if t.optimizer_site:
        more = [site for site in t.optimizer_sites if site != t.optimizer_site]
        parts.append(f"{t.optimizer_class} built at {format_site(*t.optimizer_site)}"
                     + (f" (and {len(more)} more optimizer{'s' if len(more) > 1 else ''} at "
                        f"{', '.join(format_site(*site) for site in more)})" if more else ""))
    if facts.flags:
        parts.append(f"{len(facts.flags)} flags ({', '.join(str(f['option']) for f in facts.flags[:6])})")
    say("the baseline saw: " + ("; ".join(parts) or "no DataLoader, model or optimizer"))


SCRIPT_OUTPUTS = ("best.yaml", DS_CONFIG_FILE, "best.patch", "code_change.md", "tune.json", "tune.md", "tune.html")
"""The files a script tune writes into --out, landed as one set (session.output_set): an earlier
tune's best.patch or tuned DeepSpeed config that this tune did not write is removed."""


def write_script_outputs(command: list[str], result: TuneResult, out: Path, facts: ScriptFacts | None,
                         runner: Any) -> None:
    """best.yaml, deepspeed_config.json, best.patch, code_change.md and the tables, landed as one
    set (session.output_set): all of them, or (a full disk) none, the earlier tune's kept."""
    own = facts.deepspeed_config if facts else None
    # the script's own DeepSpeed config in --out under the tuned copy's name: never removed
    keep = (DS_CONFIG_FILE,) if own is not None and Path(own.path).resolve() == (out / DS_CONFIG_FILE).resolve() else ()
    with output_set(out, SCRIPT_OUTPUTS, keep=keep) as files:
        _stage_script_outputs(command, result, out, facts, files.write_text)


def _stage_script_outputs(command: list[str], result: TuneResult, out: Path, facts: ScriptFacts | None,
                          write: Callable[..., Path]) -> None:
    from trainspeed.patches.plan import Plan, save_plan
    from trainspeed.tune.table import markdown, write_html

    targets = facts.targets if facts else Targets()
    styles = flag_styles(facts) if facts else {}
    # ZeRO settings won: the tuned DeepSpeed config is a file of its own, next to best.yaml
    settings = write_ds_config(dict(result.best_settings), facts.deepspeed_config if facts else None,
                               (out / DS_CONFIG_FILE).resolve(), write=write)
    # a what-if winner is an edit of the code (best.patch), not a setting: kept in both, the
    # patched loop would be thinned once more at run time
    kept = {k: v for k, v in settings.items() if not is_whatif({k: v})}
    plan = Plan(command=list(command), settings=kept, targets=targets, flag_styles=styles)
    run = with_own_env(f"trainspeed run --with {out / 'best.yaml'} -- {shlex.join(command)}")  # as the trials ran
    save_plan(plan, out / "best.yaml", header=(
        f"# trainspeed tune of: {shlex.join(command)}\n"
        f"# run it: {run}"
        + ("\n# the what-if winners are edits of your code: apply best.patch" if kept != settings else "")),
        write=write)
    change = None
    if result.best_settings:
        try:
            from trainspeed.patches.code_change import code_change

            device = facts.device if facts else "cpu"
            change = code_change(settings, targets, root=Path.cwd(), command=list(command),
                                 device=device, flag_styles=styles)
            loaded = threads_under_load_note(kept, result.others_load, facts.cores if facts else 0)
            if loaded:  # in code_change.md beside best.patch, and in the tune's own notes
                change.notes.append(loaded)
                result.notes.append(loaded)
            change.write(out, write=write)
        except ImportError as exc:  # libcst is an extra: the settings still work through `run --with`
            write(out / "code_change.md", f"The code change needs LibCST ({exc}); install it with "
                                          "`pip install 'trainspeed[patch]'` and rerun the tune "
                                          "with the same --out (finished trials are reused).\n")
    # what the user runs after applying best.patch: the command with the winning flags set
    tuned = (change.command or list(command)) if change is not None else list(command)
    write(out / "tune.json", json.dumps(
        {**result.as_dict(), "command": list(command), "tuned_command": tuned,
         "patch": "best.patch" if change is not None and change.patch else None}, indent=2, default=str) + "\n")
    write(out / "tune.md", markdown(result))
    write_html(result, out / "tune.html", title="trainspeed tune",
               subtitle=f"{shlex.join(command)} · {out} · {result.trials_run} trials run", write=write)


__all__ = ["run_script_tune", "command_hash", "flag_styles", "order_knobs", "write_script_outputs"]
