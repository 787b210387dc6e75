"""Why a trial measured no step, in the user's terms. A script that ends inside a trial's warm-up
(pytorch/examples' time_sequence_prediction at `--steps 2`) failed the tune's baseline with "raise
the trial's step count" and a hint to check that the script reaches optimizer steps, which it
did: what it needs is to run longer, through its own flag, or fewer warm-up steps."""

from __future__ import annotations

from typing import Any

ENDED_IN_WARMUP = "the script ended after"
"""How the error of a trial whose script ended inside its warm-up starts (search.py drops the
baseline hint after it: the script did reach its steps)."""


def no_measured_steps(run: Any, run_dir: Any, steps: int) -> str:
    """The error of a trial with no measured step: the script's end inside the warm-up, and how
    to get past it (the script's run-length flag scaled, or --warmup-steps), else the trial's
    own step count."""
    from trainspeed.doctor.checks.script_flags import find_flag, longer_run, show_flag
    from trainspeed.doctor.defaults import MEASURED_AT_LEAST
    from trainspeed.tune.knob_types import DEFAULT_WARMUP

    if not steps:  # no step at all: the baseline's hint (does the script reach optimizer steps?) applies
        return f"no training step was recorded in {run_dir}"
    observed = [(e.get("data") or {}) for e in run.events_of("observation")]
    doctor = next((o for o in observed if o.get("kind") == "doctor"), {})
    if doctor.get("stopped") not in ("end", "exit"):
        return f"no measured steps in {run_dir} (all {steps} were warm-up); raise the trial's step count (--steps)"
    warm = run.start_data().get("warmup_steps")
    flags = next((o.get("flags") for o in observed if o.get("kind") == "script_flags"), None) or []
    flag = find_flag(flags, "run_length")
    # the later trials warm up for the tune's --warmup-steps (the first, pricing one for fewer)
    need = max(warm if isinstance(warm, int) else steps, DEFAULT_WARMUP) + MEASURED_AT_LEAST
    longer = longer_run(flag, steps, need)
    longer = f"{longer} in place of {show_flag(flag)}" if longer is not None else f"at least {need} steps"
    return (f"{ENDED_IN_WARMUP} {steps} step{'s' if steps != 1 else ''}, inside the trial's warm-up (its first "
            f"steps pay one-time costs and are left out), so no step was measured: run the script longer, "
            f"{longer}, or give the tune fewer --warmup-steps (in {run_dir})")


__all__ = ["ENDED_IN_WARMUP", "no_measured_steps"]
