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
        recommendation=("mark the end of each training step with one line in the loop, after the parameter "
                        "update: `import trainspeed` at the top, then `trainspeed.step()` (a no-op outside the "
                        "doctor); the doctor then times every step and --steps N stops the run"),
        verify_with=ctx.doctor_command(),
        impact=1.0,
    )


def _install_hint() -> str:
    """How to install this trainspeed elsewhere: from its clone when it runs from one."""
    from pathlib import Path

    import trainspeed

    root = Path(trainspeed.__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file():
        return f"`pip install -e {root}`"
    return "`pip install trainspeed`"


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
    elif error.startswith(("ModuleNotFoundError", "ImportError")):
        start = next(iter(ctx.run.events_of("run_start")), {}).get("data") or {}
        fix, verify = missing_module_advice(error, ctx.command, start.get("cwd"),
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


CHECKS = (no_step_found,)
