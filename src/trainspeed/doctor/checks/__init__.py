"""Finding rules: small pure functions `(ctx: CheckContext) -> Finding | None`, one module per
family, registered in CHECKS. `diagnose(run)` runs them all and ranks the findings."""

from __future__ import annotations

from typing import Any, Callable

from trainspeed.doctor.checks import (data, deepspeed, distributed, fp64, hardware, lookups, loop, machine, no_step,
                                      syncs, threads)
from trainspeed.doctor.checks.context import CheckContext
from trainspeed.doctor.findings import Finding, rank
from trainspeed.telemetry.rundir import RunData

Check = Callable[[CheckContext], "Finding | None"]

CHECKS: tuple[Check, ...] = (*data.CHECKS, *loop.CHECKS, *syncs.CHECKS, *lookups.CHECKS, *hardware.CHECKS,
                              *distributed.CHECKS, *deepspeed.CHECKS, *machine.CHECKS, *threads.CHECKS,
                              *no_step.CHECKS, *fp64.CHECKS)
"""Every registered check, in no particular order (findings are ranked afterwards)."""


def run_checks(ctx: CheckContext, checks: tuple[Check, ...] = CHECKS) -> list[Finding]:
    """Run the checks; a check that fails is reported as an info finding, never a crash
    (the diagnosis of the user's script must not die on our bug)."""
    found: list[Finding] = []
    for check in checks:
        try:
            finding = check(ctx)
        except Exception as exc:  # noqa: BLE001
            finding = Finding(id=f"check_error.{check.__name__}", severity="info",
                              title=f"check {check.__name__} failed",
                              evidence=f"{type(exc).__name__}: {exc}",
                              recommendation="please report this trainspeed bug", impact=0.0)
        if finding is not None:
            found.append(finding)
    return found


def diagnose(run: RunData, summary: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Ranked findings (dicts) of a run directory, whoever wrote it; `summary` defaults to
    summarize(run). A script's own Monitor loop is diagnosed as that script's run, and verify
    commands that would need a config the run does not have are replaced (run_kinds.py)."""
    from trainspeed.doctor.checks.rollout import name_rollout_phase
    from trainspeed.doctor.checks.run_kinds import as_diagnosed, runnable_verify

    if summary is None:
        from trainspeed.telemetry.summary import summarize

        summary = summarize(run)
    view = as_diagnosed(run)
    ctx = CheckContext.from_run(view, summary)
    name_rollout_phase(ctx)  # the phase table names a rollout's time as such, in the summary given
    return runnable_verify(view, rank(run_checks(ctx)))


__all__ = ["CHECKS", "CheckContext", "diagnose", "run_checks"]
