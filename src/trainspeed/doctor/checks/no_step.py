"""No step was timed: the script crashed before its first training step (say what it raised
and how to get past it), or it ran without a step the doctor could see (say what was seen and
how to mark one)."""

from __future__ import annotations

from trainspeed.doctor.checks.context import CheckContext
from trainspeed.doctor.checks.missing_module import missing_module_advice
from trainspeed.doctor.checks.no_cuda import cpu_advice
from trainspeed.doctor.findings import Finding


def no_step_found(ctx: CheckContext) -> Finding | None:
    """The run recorded no step: say what was seen and how to mark one (without steps there is
    nothing to time, and --steps cannot stop the script)."""
    seen = ctx.first("step_boundary")
    if ctx.steps or seen is None:
        return None
    doctor = ctx.first("doctor") or {}
    if doctor.get("stopped") == "crash":
        return _crashed_before_a_step(ctx, doctor.get("error"))
    forwards, backwards = int(seen.get("forwards") or 0), int(seen.get("backwards") or 0)
    opt_steps = int(seen.get("optimizer_steps") or 0)
    if doctor.get("stopped") == "exit" and not forwards and not backwards:
        return _exited_before_a_step(ctx, doctor)
    if forwards == 1 and backwards and not opt_steps:
        return _one_forward_only(ctx, backwards)
    why = ("no training forward of a module with trainable parameters (an inference-only script?)" if not forwards
           else "no backward" if not backwards
           else "the gradients were never cleared between the backward and the next forward, so every "
                "backward looked like one more micro-batch of the same step" if not opt_steps
           else "the optimizer steps were not the primary optimizer's")
    return Finding(
        id="no_step_found",
        severity="warning",
        title="No training step was found, so no step was timed",
        evidence=(f"the run showed {forwards} training forwards, {backwards} backwards and {opt_steps} "
                  f"torch.optim optimizer steps: {why}"),
        recommendation=MARK_STEP,
        verify_with=ctx.doctor_command(),
        impact=1.0,
    )


MARK_STEP = ("mark the end of each training step with one line in the loop, after the parameter "
             "update: `import trainspeed` at the top, then `trainspeed.step()` (a no-op outside the "
             "doctor); the doctor then times every step and --steps N stops the run")


def _exited_before_a_step(ctx: CheckContext, doctor: dict) -> Finding:
    """The script exited itself (sys.exit, argparse) before any training work: a mistyped flag of
    its own (`--epochz 1`: argparse exits 2) or `--help`. The command is what to fix, not the
    script's loop, and nothing was at stake: no step time was lost, none was run."""
    code, said = doctor.get("exit_code"), doctor.get("said")
    evidence = f"The script exited with status {code} before its first training step"
    if said:
        evidence += f" (its own message above: `{said}`)"
        fix = "fix the command's arguments to the script (its usage is printed above), then run the doctor again"
    elif code == 0:
        evidence += ": it printed its output and exited before training (a `--help`?)"
        fix = "run the doctor with the arguments that make the script train"
    else:
        fix = "fix what made the script exit (its output is above), then run the doctor again"
    return Finding(
        id="exited_before_training",
        severity="critical" if code else "info",
        title="The script exited before its first training step, so nothing was measured",
        evidence=f"{evidence}; no forward or backward of a trainable module ran",
        recommendation=fix,
        verify_with=ctx.doctor_command(),
        impact=0.0,
    )


STOP_AFTER_ONE = ("--dry-run", "--dry_run", "--fast-dev-run", "--fast_dev_run", "--smoke-test", "--smoke_test")
"""Switches of the scripts' own that stop them after one iteration (pytorch/examples' --dry-run)."""


def _one_forward_only(ctx: CheckContext, backwards: int) -> Finding:
    """One training forward (and its backward) and no optimizer: where the step ends (at the next
    forward, once the gradients were cleared) cannot be seen. Like a run that ended inside the
    warm-up (ended_in_warmup), the way out is a longer run with the script's own flags."""
    import shlex

    from trainspeed.doctor.checks.script_flags import longer_run, script_flag, show_flag

    command = list(ctx.command or [])
    stopper = next((word for word in command if word in STOP_AFTER_ONE), None)
    flag = script_flag(ctx, "run_length")
    longer = longer_run(flag, 1, 3) if flag is not None and flag.get("value") == 1 else None
    if stopper is not None:
        run_longer = f"run the script without {stopper} (it stops the script after one iteration)"
        verify = ctx.with_pythonpath(f"trainspeed doctor -- {shlex.join([w for w in command if w != stopper])}")
    elif longer is not None:
        run_longer = f"run the script longer, {longer} in place of {show_flag(flag)}"
        verify = ctx.doctor_command(flags=[longer])
    else:
        run_longer = "run the script longer, for at least a few iterations of its loop"
        verify = ctx.doctor_command()
    return Finding(
        id="no_step_found",
        severity="warning",
        title="The run was too short to find a training step, so no step was timed",
        evidence=(f"the run ended after one training forward and backward ({backwards} backward"
                  f"{'s' if backwards != 1 else ''}, no torch.optim optimizer step): without a second forward the doctor "
                  "cannot tell where a step ends"),
        recommendation=f"{run_longer}; or {MARK_STEP}",
        verify_with=verify,
        impact=0.0,
    )


def _install_hint() -> str:
    """How to install this trainspeed elsewhere: from its clone when it runs from one."""
    from pathlib import Path

    import trainspeed

    root = Path(trainspeed.__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file():
        return f"`pip install -e {root}`"
    return "`pip install trainspeed`"


WEIGHTS_ONLY_FAILED = "Weights only load failed"
"""torch.load's error from torch 2.6 on, whose default became weights_only=True, for a file that
holds more than tensors (a pickled numpy array: pytorch/examples' time_sequence_prediction)."""


def _weights_only_advice(ctx: CheckContext) -> tuple[str, str]:
    """Get past torch.load's weights-only default without editing the script: torch's own switch
    for it, set on the command (the user decides whether the file is trusted)."""
    return ("the script's torch.load reads a file that holds more than tensors, and torch >= 2.6 loads "
            "weights only by default. If you trust the file, run with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 "
            "(torch's switch back to the old default), or pass weights_only=False to that torch.load",
            ctx.doctor_command(env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}))


def _crashed_before_a_step(ctx: CheckContext, error: str | None) -> Finding:
    """The script raised before its first training step: that, not 'no step was found' (which
    reads as a script with no training loop), is what the user must fix. A missing module is the
    usual first-run case: the doctor runs the script in trainspeed's own interpreter."""
    error = error or "an exception (the traceback is in report.json)"
    fix = "fix the error (the traceback is above and in report.json), then run the doctor again"
    verify = ctx.doctor_command()
    on_cpu = cpu_advice(ctx, error)
    if on_cpu is not None:
        fix, verify = on_cpu
    elif WEIGHTS_ONLY_FAILED in error:
        fix, verify = _weights_only_advice(ctx)
    elif error.startswith(("ModuleNotFoundError", "ImportError")):
        fix, verify = missing_module_advice(error, ctx.command, ctx.run.start_data().get("cwd"),
                                            lambda path: ctx.doctor_command(path=path), _install_hint())
    return Finding(
        id="crashed_before_training",
        severity="critical",
        title="The script crashed before its first training step, so nothing was measured",
        evidence=f"{error}; no training step ran",
        recommendation=fix,
        verify_with=verify,
        impact=0.0,
    )


def ended_in_warmup(ctx: CheckContext) -> Finding | None:
    """The script finished (or exited) before the doctor's warm-up was over: every figure of the
    step (throughput, step time, MFU) is empty. Say so first, and how to get measured steps: the
    script's own run-length flag, scaled, or fewer warm-up steps for a script of few, slow steps
    (pytorch/examples' time_sequence_prediction: 2 LBFGS steps of 30 s, the warm-up is 5)."""
    from trainspeed.doctor.checks.script_flags import longer_run, script_flag, show_flag
    from trainspeed.doctor.defaults import MEASURED_AT_LEAST

    doctor = ctx.first("doctor") or {}
    if not ctx.steps or ctx.summary.get("measured_steps") or doctor.get("stopped") not in ("end", "exit"):
        return None
    steps = ctx.steps
    warm = ctx.run.start_data().get("warmup_steps")
    if not isinstance(warm, int) or warm < steps:  # the steps marked warm-up (also: a slow first measured one)
        warm = sum(1 for step in ctx.run.steps if step.get("warmup"))
    flag = script_flag(ctx, "run_length")
    # the FLOP count takes the step after the first one and leaves it out too: of 2 steps only
    # a run without it measures one; of 1, only a run without warm-up (its one-time costs in)
    fewer_warmup = ctx.doctor_command(warmup=1 if steps > 1 else 0, no_flops=steps < 3)
    need = warm + MEASURED_AT_LEAST
    longer = longer_run(flag, steps, need)
    run_longer = (f"run the script longer, {longer} in place of {show_flag(flag)} ({need} steps: {warm} of warm-up, "
                  f"{MEASURED_AT_LEAST} measured)" if longer is not None else f"run the script for at least {need} steps")
    fix = (f"{run_longer}, or, where only its first step pays the one-time costs, let the doctor warm up for "
           f"{'one step' if steps > 1 else 'none'}: {fewer_warmup}")
    verify = ctx.doctor_command(flags=[longer]) if longer is not None else fewer_warmup
    return Finding(
        id="ended_in_warmup",
        severity="warning",
        title="The script ended inside the doctor's warm-up, so no step was measured",
        evidence=(f"the script {'finished' if doctor.get('stopped') == 'end' else 'exited'} after {steps} "
                  f"step{'s' if steps != 1 else ''}, inside the doctor's {warm} warm-up steps (they pay the "
                  "one-time costs: allocation, autotuning, compilation), which throughput, step time and MFU "
                  "leave out"),
        recommendation=fix,
        verify_with=verify,
        impact=1.0,
    )


CHECKS = (no_step_found, ended_in_warmup)
