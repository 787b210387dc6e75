"""A library that looks packages up on disk at every step (instrument/lookups.py). Reads the
observations only: no torch import (`trainspeed report` starts without it).

The fix is the script's: one line that caches the library's availability check, written out
with the module and name the doctor read from the call chain. The verify command is the
script's tune of the package_lookups knob, which applies the same cache at run time
(runtime.cache_checks) and hands back the line as best.patch.
"""

from __future__ import annotations

from typing import Any

from trainspeed.doctor.checks.context import CheckContext, ms, pct
from trainspeed.doctor.findings import Finding
from trainspeed.patches.cache_checks import cache_code

LOOKUPS_PER_STEP_MIN = 0.5
"""Lookups at least every other step: a check the library makes in its per-step code, not a
one-off lazy import."""
MIN_MEASURED_STEPS = 2
"""Measured steps (past the warm-up) the lookups must recur over before a finding says "at every
step": Lightning's bug_report_model ran 1 step (0 measured), and its first self.log's two
lookups of torch's version, made once, read as '2 lookups per step, ~6 % at stake'."""
SHARE_INFO = 0.01
SHARE_WARNING = 0.05
"""At 5 % of the time the lookups cost more than most settings a tune measures."""


def _where(obs: dict[str, Any], count: int | None) -> str:
    """"importlib.util.find_spec('lomo_optim') at accelerate/utils/imports.py:52, in
    is_lomo_available(), under `opt.step()` at train.py:25 (160 calls)"."""
    check = (obs.get("cache") or {}).get("name") or obs.get("function")
    text = f"{obs.get('call')} at {obs.get('site_text')}, in {check}()"
    user = obs.get("user_site")
    if user:
        code = f"`{user['code']}` at " if user.get("code") else ""
        text += f", under {code}{user['site']}"
    return text + (f" ({count} calls)" if count else "")


def _observed(ctx: CheckContext) -> list[tuple[dict[str, Any], int]]:
    """Each observed lookup site with the calls counted there (its call_sites row), busiest first."""
    rows = {(tuple(r.get("site_path") or ()), r.get("kind")): r for r in ctx.sites("lookup")}
    found = [(o, int((rows.get((tuple(o.get("site") or ()), o.get("package"))) or {}).get("count") or 0))
             for o in ctx.obs("package_lookup")]
    return sorted(found, key=lambda pair: -pair[1])


def _counted_steps(ctx: CheckContext) -> int:
    """The steps the lookups were counted over: from the first step boundary on (the first
    optimizer step ends step 1), the steps after it."""
    return max(1, ctx.steps - 1)


def lookup_time(ctx: CheckContext) -> tuple[int, float]:
    """(lookups, seconds inside them) over the run: the finding's figures, and the share the
    report's "What can still help" reads (checks/bound.py)."""
    totals = ctx.site_totals("lookup").values()
    return sum(v["count"] for v in totals), sum(v["seconds"] for v in totals)


def per_step_checks(ctx: CheckContext, observed: list[tuple[dict[str, Any], int]] | None = None) -> list[str]:
    """`module.function` of each cacheable check asked at least every other step, busiest first:
    what the fix line caches and the tune's package_lookups knob tries. A lazy import's
    one-off check is left out."""
    steps = _counted_steps(ctx)
    names = [f"{o['cache']['module']}.{o['cache']['name']}" for o, count in
             (_observed(ctx) if observed is None else observed)
             if o.get("cache") and count / steps >= LOOKUPS_PER_STEP_MIN]
    return list(dict.fromkeys(names))


def _measured_steps(ctx: CheckContext) -> int:
    measured = ctx.summary.get("measured_steps")
    return measured if isinstance(measured, int) else ctx.steps


def steps_enough(ctx: CheckContext) -> bool:
    """Whether the run has the steps to tell a lookup made at every step from one made once (a
    first call's lazy setup, a warm-up step): the counts have no per-step breakdown. The finding
    and the report's "What can still help" (checks/bound.py) ask the same."""
    return ctx.steps > 0 and min(_measured_steps(ctx), _counted_steps(ctx)) >= MIN_MEASURED_STEPS


def package_lookups(ctx: CheckContext) -> Finding | None:
    if not steps_enough(ctx):
        return None
    count, seconds = lookup_time(ctx)
    per_step = count / _counted_steps(ctx)
    share = ctx.time_share(seconds)
    if per_step < LOOKUPS_PER_STEP_MIN or share < SHARE_INFO:
        return None
    found = _observed(ctx)
    evidence = (f"{per_step:.2g} lookups of installed packages per step ({ms(seconds / count)} each: "
                f"{ms(seconds / _counted_steps(ctx))} a step, {pct(share)} of the time); each searches sys.path "
                "on disk. " + "; ".join(_where(o, n) for o, n in found[:3]))
    targets = per_step_checks(ctx, found)
    if targets:
        library = targets[0].split(".")[0]
        fix = (f"cache the check once, after your imports (whether a package is installed does not change "
               f"during the run; {library} asks again at every call): {'; '.join(cache_code(targets).splitlines())}")
    else:
        name = found[0][0].get("function") if found else None  # the script's own check, or a method's
        fix = (f"call {name}() once before the loop and keep its result" if name
               else "call the check once before the loop and keep its result")
    return Finding(
        id="package_lookups",
        severity="warning" if share >= SHARE_WARNING else "info",
        title="A library looks up installed packages on disk at every step",
        evidence=evidence,
        recommendation=fix,
        verify_with=ctx.tune_command("package_lookups") or f"{ctx.doctor_command()} (after the change)",
        impact=share,
        basis=f"the time inside the lookups, {pct(share)} of the steps' time",
    )


CHECKS = (package_lookups,)
