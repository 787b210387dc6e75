"""Which knob settings the ablation measures: those the budget plan admits (budget_plan.py), in
knob priority order, and the rest with why. Where the plan at `--repeats` rounds admits none but
one round of one setting fits the budget, that round is measured (repeats 1, nothing held back
for a verification the budget cannot pay for): a tune always answers what its budget can.

pytorch/examples' time_sequence_prediction (LBFGS steps of 35 s) had a baseline trial of 158 s
in an 8-minute tune: two rounds of one setting, their baselines and a verification would take
~950 s, so nothing was admitted and 322 s of the budget went unspent, "does not fit the budget".
One round (the setting and its closing baseline, beside the first baseline trial) takes 316 s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainspeed.tune.budget_plan import BudgetPlan
from trainspeed.tune.knobs import Candidate, KnobContext, Skip

Admitted = tuple[list[Candidate], list[Skip], list[str]]


def admit(tuner: Any, ctx: KnobContext, base_wall: float, *, repeats: int, reserve_s: float) -> Admitted:
    """(candidates, skipped, deferred knobs): the settings the knobs offer on `ctx` that a plan
    of `repeats` rounds with `reserve_s` held back pays for; the others go to
    `tuner.unadmitted` (spend.py measures them if the budget turns out to allow)."""
    candidates: list[Candidate] = []
    skipped: list[Skip] = []
    deferred: list[str] = []
    tuner.unadmitted = []
    # The plan prices every round's first baseline bracket at base_wall, and the first round's
    # is the first baseline trial, already paid at what it took: a nanoGPT trial sized to fit
    # the 15 trials of a 20-minute compile tune (75 s, after a 65 s first trial) priced that
    # bracket 10 s too high, and the plan fell back to one round (the sizing and the plan now
    # count alike). Where the first trial opens no round (Tuner.first_bracket: a script's
    # pricing trial), round 1's opening bracket ran before this plan (Tuner._price_from_opening)
    # and is as paid.
    first = max(tuner.spent, tuner.first_wall)
    opening = not tuner.first_bracket or (tuner.key({}), tuner.first_bracket) in tuner.ran
    reused = base_wall if opening else 0.0
    plan = BudgetPlan(base_wall=base_wall, repeats=repeats, baseline_every=tuner.opt.baseline_every,
                      budget_s=tuner.opt.budget_s - first + reused if first else tuner.opt.budget_s,
                      reserve_s=reserve_s, whole_budget_s=tuner.opt.budget_s)
    for name in tuner.opt.knobs:
        for item in tuner.knobs[name](ctx):
            if isinstance(item, Skip):
                skipped.append(item)
                if item.deferred and name not in deferred:
                    deferred.append(name)
                continue
            settings = item.settings
            key = tuner.key(settings)
            tuner.knob_of.update(dict.fromkeys(settings, name))
            tuner.cost_factor[key] = item.cost_factor
            tuner.knob_of_config[key] = name
            for k, v in settings.items():
                tuner.startup_s[(k, repr(v))] = max(item.startup_s, tuner.startup_s.get((k, repr(v)), 0.0))
            measured = getattr(tuner, "measure_steps", None)
            if item.min_steps and measured and item.min_steps > measured:
                # nanoGPT's --eval_interval=120 in place of 30, tried in trials of 8 steps: neither
                # side evaluated, and a bundle with it went into best.patch
                skipped.append(Skip(name, item.label, f"what it thins comes every {item.min_steps} steps, and the "
                                                      f"trials this budget pays for measure {measured}: neither "
                                                      "side would hold any; a larger --budget measures it"))
                continue
            why = plan.admit(item.cost_factor, len(tuner.results(settings)))
            if why is not None:
                skipped.append(Skip(name, item.label, why))
                tuner.unadmitted.append(item)
                continue
            candidates.append(item)
    return candidates, skipped, deferred


def candidates_for(tuner: Any, ctx: KnobContext, base_wall: float) -> tuple[list[Candidate], list[Skip], list[str], bool]:
    """admit() at the tune's --repeats with the verification's reserve; where that admits no
    setting, one round without the reserve (tuner.opt.repeats becomes 1 for this tune, and the
    last flag says so). The verification then runs only if the budget still has room; where it
    does not, the ablation's winner is the answer, its note says how it was measured
    (verify.final_answer)."""
    full = admit(tuner, ctx, base_wall, repeats=tuner.opt.repeats, reserve_s=tuner._verify_reserve())
    if full[0] or not tuner.unadmitted or tuner.opt.repeats <= 1:
        return (*full, False)
    refused = list(tuner.unadmitted)
    lean = admit(tuner, ctx, base_wall, repeats=1, reserve_s=0.0)
    if not lean[0]:
        tuner.unadmitted = refused
        return (*full, False)
    names = ", ".join(f"{c.knob}={c.label}" for c in lean[0])
    tuner.say(f"the budget pays for one round of {names}, not {tuner.opt.repeats} with a verification: measuring "
              "that once against the baseline, so the tune answers what it can (a larger --budget measures more)")
    tuner.asked_repeats = tuner.opt.repeats  # more rounds, while the budget allows: spend._wanted
    tuner.opt = dataclasses.replace(tuner.opt, repeats=1)
    return (*lean, True)


__all__ = ["admit", "candidates_for"]
