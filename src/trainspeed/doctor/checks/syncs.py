"""Host-sync findings: reads of device values every step, and cache/GC calls in the loop."""

from __future__ import annotations

import linecache
import re
from typing import Any

import numpy as np

from trainspeed.doctor.checks.context import CheckContext, describe_site, ms, pct
from trainspeed.doctor.checks.gpu_time import CACHE_GC_KINDS, gpu_time
from trainspeed.doctor.findings import Finding

SYNCS_PER_STEP_WARNING = 0.5
"""A device read (`.item()`, `.cpu()`, `float(t)`...) at least every other step: each one
drains the GPU's queue, so the CPU cannot run ahead and kernel launches stop overlapping
(PyTorch Performance Tuning Guide, "avoid unnecessary CPU-GPU synchronization")."""
SYNCS_PER_STEP_CRITICAL = 10.0
"""Ten or more per step on a GPU: the loop is effectively synchronous."""
CACHE_GC_PER_STEP_WARNING = 0.5
"""`torch.cuda.empty_cache()` / `gc.collect()` at least every other step (PyTorch CUDA
semantics docs: empty_cache does not free memory for PyTorch and forces re-allocation;
gc.collect walks every Python object)."""
CACHE_GC_MIN_CALLS = 3
"""A call inside the loop repeats: one call in a run cut short after two steps (an empty_cache
before the loop, then a crash) is 0.5 per step, and no sign of a loop."""
_LABELS = {"empty_cache": "torch.cuda.empty_cache()", "gc_collect": "gc.collect()"}

KNOWN_LIBRARY_SYNCS: tuple[tuple[str, str, str, str, object], ...] = (
    ("transformers", "logging_nan_inf_filter", "TrainingArguments(logging_nan_inf_filter=False)",
     "the Trainer checks every step's loss for NaN/Inf on the host when it is on, the default", False),
    ("transformers", "fast_all(padding_mask)",
     "attention_mask=None when no token is padded (packed blocks of text, as run_clm's group_texts makes: "
     "drop the all-ones mask, `batch.pop(\"attention_mask\", None)` before `model(**batch)`)",
     "transformers reads the mask back at every forward to learn whether it is all ones, and reads nothing "
     "without one (masking_utils._ignore_causal_mask_sdpa)", None),
    *((package, "to_item", "prog_bar=False in the `self.log(...)` of values logged every step",
       "Lightning reads each value logged with prog_bar=True back to the host every step, for the progress bar",
       False) for package in ("lightning", "lightning_fabric")),
)
"""(package, text near the calling line, the setting that removes the read, why, the value
that removes it). The marker is also a script_flags topic: a script that parses the library's
settings as flags (an HfArgumentParser over TrainingArguments: run_clm.py) is told its flag,
`--logging_nan_inf_filter False`, not a constructor keyword it cannot reach from the command line."""

LIGHTNING_LOG_READS = (
    "Trainer(log_every_n_steps=N) with a larger N, or fewer values in `self.log(...)` (Lightning turns each "
    "logged tensor into a Python number, `value.item()` in convert_tensors_to_scalars, when it writes the "
    "logs: every log_every_n_steps steps, 50 by default, and at the end of an epoch and of fit, validate "
    "or test; every step only for values logged with prog_bar=True, for the progress bar)")
"""Lightning's `to_item` reads where the script's training_step logs nothing with prog_bar=True
(bug_report_model's `self.log("train_loss", loss)`): they come from the logger connector's
log_metrics and the trainer's validate/test results (lightning 2.6), not the progress bar, so
"set prog_bar=False" named a setting the script did not have."""


def library_of(row: dict[str, Any] | str) -> str | None:
    """The installed package a call site lies in (None: the user's own code): the package the
    run recorded for it (its own sys.path knew a `pip install --target` folder or a library's
    editable checkout), else read from a site-packages path (runs recorded before that)."""
    if isinstance(row, dict) and row.get("library"):
        return str(row["library"])
    site = str(row.get("site", "")) if isinstance(row, dict) else row
    match = re.search(r"[/\\](?:site|dist)-packages[/\\]([^/\\]+)[/\\]", site)
    return match.group(1) if match else None


def _known_sync(row: dict[str, Any], lookahead: int = 5) -> tuple[str, str, str, object] | None:
    """(marker, setting, why, value) of the KNOWN_LIBRARY_SYNCS entry a library call site
    matches (its package, and the marker in the calling lines), or None."""
    package = library_of(row)
    path = row.get("site_path")
    if isinstance(path, (list, tuple)) and len(path) == 2 and str(path[1]).isdigit():
        filename, lineno = str(path[0]), str(path[1])
    else:
        filename, _, lineno = str(row.get("site", "")).rpartition(":")
    if package is None or not lineno.isdigit():
        return None
    text = " ".join(linecache.getline(filename, int(lineno) + k) for k in range(lookahead))
    return next((entry[1:] for entry in KNOWN_LIBRARY_SYNCS if entry[0] == package and entry[1] in text), None)


def library_advice(row: dict[str, Any], lookahead: int = 5, ctx: CheckContext | None = None) -> str | None:
    """The known setting that removes a library's per-step read, from the calling lines; with
    `ctx`, the script's own flag for it when the script parses one."""
    from trainspeed.doctor.checks.script_flags import script_flag, set_flag, show_flag

    known = _known_sync(row, lookahead)
    if known is None:
        return None
    marker, setting, why, value = known
    flag = script_flag(ctx, marker) if ctx is not None else None
    if flag:
        return f"{set_flag(flag, value)} (the script's flag, now {show_flag(flag)}: {why})"
    if marker == "to_item":
        from trainspeed.doctor.checks.lightning_logs import prog_bar_logs

        calls = prog_bar_logs(ctx) if ctx is not None else []
        if not calls:  # the read is the logger connector's, or the script's prog_bar calls are not seen
            return LIGHTNING_LOG_READS
        why += f"; yours: {', '.join(calls)}"
    return f"{setting} ({why})"


def _fix(first: dict[str, Any] | None, ctx: CheckContext | None = None) -> str:
    generic = ("keep the value on the device (`total += loss.detach()`) and read it only every K steps "
               "when you log; replace `if tensor:` checks by device-side ops (torch.where, "
               "torch.nan_to_num) (engine: logging.every=50)")
    if first is None:
        return generic
    package = library_of(first)
    if package is None:
        return f"For {describe_site(first)}: {generic}"
    advice = library_advice(first, ctx=ctx)
    return (f"the top read happens inside {package} ({describe_site(first)}), not in your code: "
            + (f"{'pass' if advice.startswith('-') else 'set'} {advice}" if advice else
               f"look for the {package} option that reads a value every step (logging, NaN checks, "
               "metrics), or train with the engine, which reads device values at the log interval only"))


def _validate_fix(rows: list[dict[str, Any]]) -> str | None:
    """The advice when a distribution's own argument checks lead the reads (an RL loop's
    `Categorical(probs)` and `m.log_prob(action)` at every environment step: reinforce.py's
    top two sites), else None. The generic "keep the value on the device" fits no line there."""
    checks = [r for r in rows if r.get("kind") == "validate_args"]
    others = [r for r in rows[:3] if r.get("kind") != "validate_args"]
    # leading: among the top three, and at least as many as the busiest other site (one read
    # each per environment step tie, and the order of a tie is the time inside them)
    if not any(r.get("kind") == "validate_args" for r in rows[:3]) or (
            others and sum(int(r.get("count") or 0) for r in checks) < int(others[0].get("count") or 0)):
        return None
    where = " and ".join(describe_site(r) for r in checks[:2])
    rest = (f"; the other reads ({'; '.join(describe_site(r) for r in others)}) are the script's own"
            if others else "")
    return (f"torch.distributions checks each distribution's arguments and each value given to log_prob "
            f"on the host (`if not valid.all()`), by default, at {where}: pass validate_args=False to "
            "the distribution (`Categorical(probs, validate_args=False)`), or call "
            "`torch.distributions.Distribution.set_default_validate_args(False)` once before the loop "
            "(`python -O` turns the checks off too); they catch wrong arguments while you write the code, "
            f"and cost a read per call while it trains{rest}")


def _log_interval_fix(ctx: CheckContext, first: dict[str, Any] | None,
                      steps_with: float | None) -> tuple[dict[str, Any], int] | None:
    """(the script's log-interval flag, the value to raise it to) when the reads come once per
    that interval (nanoGPT with --log_interval=1: `loss.item()` inside `if iter_num %
    log_interval == 0` every step), else None."""
    from trainspeed.doctor.checks.script_flags import script_flag

    if first is None or steps_with is None or library_of(first) is not None:
        return None
    flag = script_flag(ctx, "log_interval")
    value = flag.get("value") if flag else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or abs(steps_with * value - 1) > 0.3:
        return None
    return flag, max(50, value * 10)


def _at_log_interval(ctx: CheckContext, first: dict[str, Any] | None, steps_with: float) -> str | None:
    """The lead of the advice when the reads come once per the script's own log interval flag:
    raising that flag is the one-word fix, run on the user's own command."""
    from trainspeed.doctor.checks.script_flags import set_flag, show_flag

    fix = _log_interval_fix(ctx, first, steps_with)
    if fix is None:
        return None
    flag, target = fix
    return (f"For {describe_site(first)}: the reads come once per the script's log interval ({show_flag(flag)}): "
            f"log less often, {set_flag(flag, target)}; or keep the value on the device "
            "(`total += loss.detach()`) and read it only when you log (engine: logging.every=50)")


def _fix_flag(ctx: CheckContext, first: dict[str, Any] | None, steps_with: float | None = None) -> str | None:
    """The script argument the recommendation's fix is (`--logging_nan_inf_filter False`,
    `--log_interval=50`), or None when the fix is a code change."""
    from trainspeed.doctor.checks.script_flags import script_flag, set_flag

    if first is None:
        return None
    known = _known_sync(first)
    if known is not None:
        flag = script_flag(ctx, known[0])
        return set_flag(flag, known[3]) if flag else None
    fix = _log_interval_fix(ctx, first, steps_with)
    return set_flag(*fix) if fix else None


def _verify(ctx: CheckContext, first: dict[str, Any] | None, count: int, per_step: float,
            steps_with: float | None = None) -> str:
    """The doctor command with the fix when it is a script flag, and the sync rate to expect:
    the reads at other call sites stay (run_clm.py: the Trainer's NaN check, 2 a step, goes with
    --logging_nan_inf_filter False; transformers' mask check, 1 a step, stays)."""
    checks = int((ctx.site_totals("sync").get("validate_args") or {}).get("count") or 0)
    if _validate_fix(ctx.sites("sync")) is not None and count:
        left = per_step * max(0.0, 1 - checks / count)
        return (f"{ctx.doctor_command()} with validate_args=False (syncs per step should drop from "
                f"{per_step:.2g} to about {left:.2g}: the reads at the other call sites stay)")
    arg = _fix_flag(ctx, first, steps_with)
    # an option (`--log_interval=50`) or a Hydra override (`trainer.log_every=50`), not "(leave out ...)"
    command = ctx.doctor_command(flags=[arg] if arg and not arg.startswith("(") else [])
    if arg and first is not None and count:
        left = per_step * (1 - int(first.get("count") or 0) / count)
        if left >= 0.1:
            return (f"{command} (syncs per step should drop from {per_step:.2g} to about {left:.2g}: "
                    "the reads at the other call sites stay)")
    return f"{command} (syncs per step should drop below 0.1)"


def _steady_rate(ctx: CheckContext, reads: int, all_syncs: int) -> tuple[float, float, int]:
    """(device reads per steady-state step, share of those steps with any, one-off reads).

    The step records count every sync per step (gc/empty_cache included, as the report's
    header does); steady state is the measured steps (warm-up excluded), so one-off work (a
    first iteration's callback, an evaluation after the last step) is not spread over the
    steps. Reads are the records' figure times the share of reads among all counted calls.
    A run that ended in the warm-up: all its records, as the header's figure is (summary.py), so
    both say one rate (time_sequence_prediction read 21 in the header and 22 in the finding: the
    call sites' 44 over 2 steps counted the 2 reads after its last step in). Records without sync
    counts (older runs): the call-site count over all steps."""
    per_step_all = ctx.run.array("syncs")
    warm = ctx.run.array("warmup") > 0.5
    steady = per_step_all[np.isfinite(per_step_all) & ~warm]
    if steady.size == 0:
        steady = per_step_all[np.isfinite(per_step_all)]
        if steady.size and not steady.sum() > 0:
            # counted, and none inside its steps: bug_report_model's one step read nothing, its 8
            # reads came after it (Lightning's end-of-fit logging, checkpoint name, test results)
            return 0.0, 0.0, reads
    if not np.nansum(per_step_all) > 0 or steady.size == 0:
        return reads / ctx.steps, 1.0 if reads else 0.0, 0
    header = ctx.summary.get("syncs_per_step")
    rate = float(header) if isinstance(header, (int, float)) else float(steady.mean())
    fraction = reads / all_syncs if all_syncs else 1.0
    in_steady = float(steady.sum()) * fraction
    return rate * fraction, float((steady > 0).mean()), max(0, int(round(reads - in_steady)))


def host_syncs(ctx: CheckContext) -> Finding | None:
    if not ctx.steps:
        return None
    all_totals = ctx.site_totals("sync")
    totals = {k: v for k, v in all_totals.items() if k not in CACHE_GC_KINDS}
    count = sum(v["count"] for v in totals.values())
    per_step, steps_with, one_off = _steady_rate(ctx, count, sum(v["count"] for v in all_totals.values()))
    if per_step < SYNCS_PER_STEP_WARNING:
        return None
    seconds = sum(v["seconds"] for v in totals.values())
    rows = [r for r in ctx.sites("sync") if r.get("kind") not in CACHE_GC_KINDS]
    top = "; ".join(f"{describe_site(r)} ({r['kind']}, {r['count']} calls)" for r in rows[:3])
    cuda = ctx.device_type == "cuda"
    share = ctx.time_share(seconds)
    # one step recorded shows no recurrence: "every step" would claim what no second step showed
    when = ("in its one recorded step" if ctx.steps < 2 else
            "every step" if steps_with >= 0.9 else f"on {pct(steps_with)} of the steps")
    rate = f"{per_step:.2g} host syncs {when}" if ctx.steps < 2 else f"{per_step:.2g} host syncs per step, {when}"
    if not ctx.summary.get("measured_steps"):  # a script that ended in the warm-up: the rate is over all its steps
        over = "all steps, warm-up included" + (f", plus {one_off} one-off reads outside the steps" if one_off else "")
    else:
        over = "steady-state steps" + (f", plus {one_off} one-off reads outside the steady-state steps (warm-up, "
                                       "after the last step)" if one_off else "")
    evidence = (f"{rate} ({over}; {count} in all, "
                f"{ms(seconds)} inside them = {pct(share)} of the time); top: {top}.")
    if cuda:
        impact, basis = gpu_time(ctx).sync_stake()
        estimated = False
        severity = "critical" if per_step >= SYNCS_PER_STEP_CRITICAL else "warning"
    else:
        # On a CPU nothing runs ahead: a read waits for nothing, so nothing is at stake here.
        impact, estimated, severity = share, False, "info"
        basis = f"the time inside the reads, {pct(share)}"
        evidence += (" On this CPU run they cost nothing; on a GPU each one makes the host wait for the "
                     "GPU's queue to drain: the doctor measures that wait there")
        if _validate_fix(rows) is not None:
            # reinforce.py without the checks, A/B under the doctor on a CPU: 1.19-1.21x the samples/s
            evidence += ("; the distributions' checks also compute their constraints on every call, which the "
                         "time inside the reads leaves out: measure without them (the verify line)")
    first = rows[0] if rows else None
    return Finding(
        id="host_syncs",
        severity=severity,
        title=f"The loop reads device values {when} (host syncs)",
        evidence=evidence,
        recommendation=_validate_fix(rows) or _at_log_interval(ctx, first, steps_with) or _fix(first, ctx),
        verify_with=_verify(ctx, first, count, per_step, steps_with),
        impact=impact,
        impact_estimated=estimated,
        basis=basis,
    )


def cache_gc_in_loop(ctx: CheckContext) -> Finding | None:
    if not ctx.steps:
        return None
    totals = {k: v for k, v in ctx.site_totals("sync").items() if k in CACHE_GC_KINDS}
    calls = {k: v["count"] / ctx.steps for k, v in totals.items()}
    hot = {k: v for k, v in calls.items()
           if v >= CACHE_GC_PER_STEP_WARNING and totals[k]["count"] >= CACHE_GC_MIN_CALLS}
    if not hot:
        return None
    seconds = sum(totals[k]["seconds"] for k in hot)
    share = ctx.time_share(seconds)
    rows = [r for r in ctx.sites("sync", tuple(hot)) if r.get("count")]
    sites = "; ".join(f"{describe_site(r)} ({r['count'] / ctx.steps:.1f}/step)" for r in rows[:3])
    names = " and ".join(_LABELS[k] for k in sorted(hot))
    return Finding(
        id="cache_gc_in_loop",
        severity="warning",
        title=f"{names} runs inside the training loop",
        evidence=(", ".join(f"{_LABELS[k]} {v:.1f} per step" for k, v in sorted(hot.items()))
                  + f", {ms(seconds)} in total = {pct(share)} of the time; at {sites}"),
        recommendation=("remove them from the loop: empty_cache hands cached blocks back to the driver only "
                        "for PyTorch to re-allocate them (a sync each time), and gc.collect walks every Python "
                        "object. If memory is the reason, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; "
                        "call gc.freeze() after setup to shrink GC pauses"),
        verify_with=ctx.tune_command("no_gc"),
        impact=share,
        basis="the time inside these calls, measured",
    )


CHECKS = (host_syncs, cache_gc_in_loop)
