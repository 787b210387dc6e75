"""Spending the budget on what is left to learn, after the ablation's planned rounds.

The ablation admits the settings whose planned rounds fit the budget at the first baseline
trial's price (budget_plan.py). That price is a guess: on a 2-core machine that others loaded,
the demo's first baseline priced its trials at ~37 s, a 3m tune admitted nothing, and it stopped
with most of the budget unused ("~147 s for 2 repeats; --budget 8m ..."), exit 0. Here:

- successive halving: after one round a clear loser (slower than *both* baseline trials around
  it by CLEAR_LOSER) is not repeated, and when the next round of the rest does not fit, the
  slowest of them are dropped until it does;
- the trials are repriced from what the baseline trials of this tune really took;
- settings not admitted are then measured one round at a time while a round fits, and settings
  still undecided (fewer rounds than planned, faster but not beyond the noise, or reading faster
  with an interval that reaches below 1, or reading slower with one that reaches past the
  floor) get fresh rounds, each with fresh baseline trials around them (B C1 C2 B), until the
  budget left is the verification's reserve (while no setting is faster beyond the noise, all
  but one round of it), or a setting has had TuneOptions.max_rounds (`--max-rounds`, default 12);
- while two hopefuls (or one beside another knob's setting that reads faster) stand, the rounds also leave
  the price of the search's comparison of them together (search.Tuner._try_together): without
  it the rounds took every second but the verification's, and dcgan's compile 1.04x and
  channels_last 1.07x (each inside the noise) were never tried together, "does not fit the
  budget"; a synthetic pair of 2 % gains was skipped at every budget from 120 to 400 s.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from trainspeed.tune import stats
from trainspeed.tune.arms import arm_of
from trainspeed.tune.knobs import Candidate
from trainspeed.tune.order import bracket_repeats, n_brackets

Tuner = Any
"""search.Tuner, which imports this module (its trials, pairs and budget are read here)."""
STOP_BELOW = 0.5
"""A candidate measured below this share of the baseline's speed (in the middle of its rounds so far) is not repeated
(bf16 on a CPU without bf16 units, 0.25x, took three baseline trials' time in every round;
against the ~15 % per round of a noisy VM, one round decides a 2x difference)."""
CLEAR_LOSER = 0.85
"""After one round, a candidate slower than this share of the speed of each baseline trial
around it is a clear loser: both neighbours beat it by 15 %+, which one noisy round of a
candidate that changes nothing does not do."""
LOSER_Z = 3.0
"""On a machine whose baseline trials spread by s (sd of log cost), a clear loser is slower
than exp(-LOSER_Z * s) of each neighbour too (15 % trial scatter: 0.64x)."""
CONFIRM_Z = 3.0
"""Standard errors the rounds after a hopeful's choice must clear together (one more look at
a setting already looked at: stricter than the ablation's stats.POOLED_Z)."""
LATE_REPEAT = 100
"""Repeat numbers of a setting first measured after the ablation start here, apart from the
numbers a resumed ablation would give it."""

Pair = tuple[tuple[int, ...], int]


def planned_trials(cost: float, n: int, repeats: int, every: int, verify: int, reuse_first: bool = True) -> float:
    """Trials (in baseline-trial units) the ablation of n settings whose trials cost `cost`
    baselines together, and the verification, take after the first baseline trial (the first
    round's opening bracket where `reuse_first`: see Tuner.first_bracket)."""
    return repeats * (cost + n_brackets(n, every)) - (1 if reuse_first else 0) + 2 * verify


def offered(tuner: Tuner, ctx: Any) -> list[Candidate]:
    """The settings the knobs offer on the baseline (before the budget admits any)."""
    return [item for name in tuner.opt.knobs for item in tuner.knobs[name](ctx) if isinstance(item, Candidate)]


def reprice(tuner: Tuner) -> None:
    """The price of a trial from the baseline trials this tune ran after its first (that one
    may have run shorter or on another machine state): their median wall time."""
    walls = [r.wall_s for r in tuner.results({}) if r.ok and r.repeat > 0 and r.wall_s > 0
             and (r.key, r.repeat) in tuner.ran]
    if walls:
        tuner.base_wall = statistics.median(walls)


def _left(tuner: Tuner, may_win: bool = True) -> float:
    """Budget left for more rounds: less the verification's reserve where a setting may win,
    else one verification round's (the demo on a busy machine measured its last settings at
    3.5x in a round that took the rest of the budget, and nothing was verified)."""
    return tuner.opt.budget_s - tuner.spent - (tuner._verify_reserve() if may_win else tuner._one_verify_round())


def _round_qs(tuner: Tuner, c: Candidate, pair: Pair) -> list[float]:
    """The candidate's speed over each baseline trial of one round's pair (>1: faster)."""
    rounds, _ = tuner._paired(c.settings, {}, [pair])
    if not rounds:
        return []
    refs, cand = rounds[0]
    mine = stats.arm_cost(arm_of([cand]))
    return [stats.arm_cost(arm_of([ref])) / mine for ref in refs] if mine > 0 else []


def _pairs_so_far(tuner: Tuner, i: int, r: int) -> list[Pair]:
    """Candidate i's pairs of ablation rounds 0..r (the baseline trials around it, its trial)."""
    R, every = tuner.opt.repeats, tuner.opt.baseline_every
    return [(bracket_repeats(i, k, R, every, tuner.first_bracket), k) for k in range(r + 1)]


def halve(tuner: Tuner, candidates: list[Candidate], r: int) -> None:
    """After ablation round r: drop what ran far slower (STOP_BELOW); before the last round
    also clear losers, then the slowest until the rest's next round fits the budget (with the
    verification's reserve)."""
    R, every = tuner.opt.repeats, tuner.opt.baseline_every
    for i, c in enumerate(candidates):
        if tuner.key(c.settings) in tuner.dropped:
            continue
        # Its rounds so far, not this one alone: word_language_model's fused AdamW read ~1.9x in
        # its first round and 0.34x in the second (a neighbour's load landed on that one trial),
        # was dropped, and the tune ended with 330 s of its 600 unspent. A setting far slower in
        # truth is far slower in most of its rounds.
        rounds, _ = tuner._paired(c.settings, {}, _pairs_so_far(tuner, i, r))
        qs = [stats.arm_cost(arm_of([refs])) / stats.arm_cost(arm_of([cand])) for refs, cand in rounds]
        if qs and statistics.median(qs) < STOP_BELOW:
            q = statistics.median(qs)
            _drop(tuner, c, "far slower, not repeated",
                  f"{q:.2f}x the baseline's speed{' (the middle of its rounds)' if len(qs) > 1 else ''}, not repeated")
    if r >= R - 1:
        return
    reprice(tuner)
    alive: list[tuple[float, Candidate]] = []
    loser = min(CLEAR_LOSER, math.exp(-LOSER_Z * _trial_sd(tuner)))
    for i, c in enumerate(candidates):
        key = tuner.key(c.settings)
        if key in tuner.dropped:
            continue
        # every round so far, as the far-slower test above: one round a neighbour's load slowed
        # must not end a setting that read faster before it
        rounds = [qs for pair in _pairs_so_far(tuner, i, r) if (qs := _round_qs(tuner, c, pair))]
        if not rounds:
            continue
        middle = statistics.median([q for qs in rounds for q in qs])
        if all(max(qs) < loser for qs in rounds):
            after = "after one round" if len(rounds) == 1 else f"in each of its {len(rounds)} rounds"
            _drop(tuner, c, f"a clear loser {after} ({middle:.2f}x), not repeated")
        else:
            alive.append((middle, c))
    alive.sort(key=lambda item: -item[0])
    need = lambda n: tuner.base_wall * (sum(c.cost_factor for _, c in alive[:n]) + n_brackets(n, every))  # noqa: E731
    n = len(alive)
    while n > 1 and need(n) > _left(tuner):
        n -= 1
    for q, c in alive[n:]:
        _drop(tuner, c, f"{q:.2f}x after one round; the budget left fits another round of the "
                        f"{n} fastest only")
    # the later rounds leave the verification one round at least (a 3.8x winner of a busy
    # machine's demo went unverified: its second ablation round took the verification's budget)
    tuner.reserve_s = tuner._one_verify_round()


def _trial_sd(tuner: Tuner) -> float:
    """The spread (sd of log cost) of this tune's baseline trials so far: how far apart two
    trials of one config land on this machine now (0 with fewer than 3)."""
    costs = [stats.arm_cost(arm_of([r])) for r in tuner.results({}) if r.ok and r.step_times]
    logs = [math.log(c) for c in costs if c > 0 and math.isfinite(c)]
    return statistics.stdev(logs) if len(logs) >= 3 else 0.0


def _drop(tuner: Tuner, c: Candidate, why: str, said: str | None = None) -> None:
    key = tuner.key(c.settings)
    tuner.dropped.add(key)
    tuner.drop_why[key] = why
    tuner.say(f"  {c.knob}={c.label}: {said or why}")


def _tentative(tuner: Tuner, c: Candidate, pairs: list[Pair], round_sd: float) -> stats.Comparison | None:
    """The candidate's comparison so far, judged as its table row will be: with the spread of
    the baseline trials around it (search.Tuner's row). Without that spread, a setting at 1.23x
    (CI 1.20-1.27) between baseline trials 5.1-7.2 ms apart read "faster" here and "no
    measurable change" in the table: no more rounds, no winner, most of the budget unspent."""
    rounds, failed = tuner._paired(c.settings, {}, pairs)
    if failed or not rounds:
        return None
    ref, cand = arm_of([refs for refs, _ in rounds]), arm_of([[x] for _, x in rounds])
    # The row's own bootstrap (stats.compare's n_boot and seed): with 100 resamples, timm's bf16
    # read CI 1.13-1.38 here, "faster", so no more rounds were run, and 1.09-1.36 in the table,
    # "no measurable change", with 111 s of its 240 s budget unspent.
    return stats.compare(ref, cand, min_effect=tuner.opt.min_effect, round_sd=round_sd,
                         bracket=stats.bracket_spread([stats.repeat_costs(arm_of(refs)) for refs, _ in rounds]))


@dataclass(frozen=True)
class Wanted:
    """What the rounds so far say beside the wanted candidates (see _wanted)."""

    winner: bool
    """A measured setting reads faster beyond the noise: a verification will follow."""
    inside: list[Candidate]
    """The hopefuls: faster within their trials, not yet beyond the noise."""
    faster_knobs: set[str]
    """The knobs of the settings that read faster than the --min-effect floor."""

    @property
    def may_win(self) -> bool:
        """A measured setting reads faster than the floor."""
        return bool(self.faster_knobs)


def _wanted(tuner: Tuner, candidates: list[Candidate], pairs: list[list[Pair]]
            ) -> tuple[list[int], "Wanted"]:
    """Indices of the candidates worth another round, most wanted first: never measured, then
    measured in fewer rounds than --repeats asked, then faster within their trials (confidence
    interval above 1) but not beyond the noise yet: the search's hopefuls; then those whose
    interval still reaches past the --min-effect floor, reading faster first. Whether any measured one
    reads faster so far (then the verification's reserve is held back; else a tune whose first
    trial was priced too high would keep it for a verification nothing can reach), whether one
    is faster beyond the noise, the hopefuls as they stand, more rounds due or not (the together
    comparison's members), and the knobs of the settings that read faster: a Wanted."""
    # the rounds asked for (--repeats): a tune whose first trial priced one round only
    # (admit.candidates_for) gives the second when its trials turn out cheaper
    R = tuner.asked_repeats or tuner.opt.repeats
    logs = []
    for c, p in zip(candidates, pairs):
        rounds, _ = tuner._paired(c.settings, {}, p)
        if rounds:
            logs.append(stats.round_log_ratios(arm_of([x for x, _ in rounds]), arm_of([[y] for _, y in rounds])))
    round_sd = stats.pooled_round_sd(logs)
    first, short, hopeful, undecided = [], [], [], []
    winner = False
    inside: list[Candidate] = []
    faster_knobs: set[str] = set()
    for i, (c, p) in enumerate(zip(candidates, pairs)):
        key = tuner.key(c.settings)
        rounds, failed = tuner._paired(c.settings, {}, p)
        comp = _tentative(tuner, c, p, round_sd) if rounds and not failed else None
        if comp is not None and comp.speedup > 1.0 + tuner.opt.min_effect:
            faster_knobs.add(c.knob)
        no_change = comp is not None and stats.speed_verdict(comp) == stats.NO_CHANGE
        winner = winner or (comp is not None and stats.speed_verdict(comp) == stats.FASTER)
        faster_inside_noise = no_change and comp.ci_low > 1.0
        if faster_inside_noise and key not in tuner.dropped and not tuner.is_whatif(c.settings):
            inside.append(c)
        if key in tuner.dropped or len(p) >= max(R, tuner.opt.max_rounds) or failed:
            continue
        if not rounds:
            first.append(i)
        elif len(rounds) < R:
            short.append(i)
        elif comp is not None and stats.speed_verdict(comp) == stats.FASTER and key in tuner.chosen_after \
                and not _confirmed(tuner, c.settings, p, round_sd)[0]:
            # faster over all its rounds, but the rounds since it was chosen do not confirm it
            # yet (confirm): its table row would read "no measurable change", so more rounds
            hopeful.append(i)
        elif no_change:
            if faster_inside_noise:  # faster within its trials, not yet beyond the noise
                hopeful.append(i)
                tuner.chosen_after.setdefault(key, len(p))
            elif comp.ci_high > 1.0 + tuner.opt.min_effect:
                # its interval reaches both below 1 and past the floor: a Lightning script's 1.26x
                # (CI 0.74-2.04) stopped there with half the budget left, nanoGPT's compile at
                # 0.93x (CI 0.67-1.21, one round) with 518 s of 780 left. More rounds decide it,
                # those reading faster first, held to a hopeful's rule (confirm)
                undecided.append((-comp.speedup, i))
                tuner.chosen_after.setdefault(key, len(p))
    return first + short + hopeful + [i for _, i in sorted(undecided)], Wanted(winner, inside, faster_knobs)


def _together_hold(tuner: Tuner, inside: list[Candidate], faster_knobs: set[str]) -> float:
    """The budget the search's together comparison will need (R trials of the reference, R of
    the bundle: search.Tuner._compare_on_top), when it will be tried: two hopefuls or more, or
    one beside a setting of another knob that reads faster (the bundle then goes on top of the
    winner). One knob's settings are rivals, not a bundle: they count once. A lone hopeful that
    reads faster is no bundle: nanoGPT's compile at 1.12x (CI 1.01-1.21, noise 5 %) held back a
    together comparison with nothing to go with it, no round fitted beside that and the
    verification's reserve, and the tune stopped at 371 s of its 20 minutes, nothing kept."""
    knobs = {c.knob for c in inside}
    if len(knobs) < 2 and not (knobs and faster_knobs - knobs):
        return 0.0
    return tuner.opt.repeats * tuner.base_wall * (1.0 + max(c.cost_factor for c in inside))


def fresh_round(tuner: Tuner, candidates: list[Candidate], chosen: list[int], pairs: list[list[Pair]],
                parity: int) -> None:
    """One round of the chosen candidates, B C1 C2 B ... with fresh baseline repeats (groups
    in reverse order on odd parity), each candidate's pair appended to its list."""
    every = tuner.opt.baseline_every
    base_key = tuner.key({})
    groups = [chosen[g:g + every] for g in range(0, len(chosen), every)]
    start = tuner.next_repeat.get(base_key, tuner.opt.repeats)
    brackets = list(range(start, start + len(groups) + 1))
    tuner.next_repeat[base_key] = start + len(groups) + 1
    order = list(range(len(groups)))[::-1] if parity % 2 else list(range(len(groups)))
    arms: list[tuple[dict[str, Any], str, int]] = [({}, "baseline", brackets[order[0] + (1 if parity % 2 else 0)])]
    for g in order:
        for i in groups[g]:
            c = candidates[i]
            key = tuner.key(c.settings)
            rep = tuner.next_repeat.get(key, max([tuner.opt.repeats] + [p[1] + 1 for p in pairs[i]]))
            tuner.next_repeat[key] = rep + 1
            arms.append((c.settings, f"{c.knob}={c.label}", rep))
            pairs[i].append(((brackets[g], brackets[g + 1]), rep))
        arms.append(({}, "baseline", brackets[g] if parity % 2 else brackets[g + 1]))
    tuner._round(arms, reverse=False)


def _fitting(tuner: Tuner, candidates: list[Candidate], wanted: list[int], left: float) -> list[int]:
    """The wanted candidates, in order, whose round (with its baseline trials) fits `left`."""
    chosen: list[int] = []
    for i in wanted:
        trial = [*chosen, i]
        cost = sum(tuner._price(tuner.key(candidates[j].settings)) for j in trial)
        if cost + tuner.base_wall * n_brackets(len(trial), tuner.opt.baseline_every) <= left:
            chosen = trial
    return chosen


def spend_rest(tuner: Tuner, candidates: list[Candidate], pairs: list[list[Pair]],
               unadmitted: list[Candidate]) -> list[Candidate]:
    """Rounds for what is left to learn while a round fits the budget (see the module
    docstring). The settings not admitted that get measured here are appended to
    `candidates` (their pairs to `pairs`) and returned."""
    n_admitted = len(candidates)
    for c in unadmitted:
        key = tuner.key(c.settings)
        tuner.cost_factor.setdefault(key, c.cost_factor)
        tuner.next_repeat.setdefault(key, LATE_REPEAT)
        candidates.append(c)
        pairs.append([])
    parity = 0
    while True:
        reprice(tuner)
        wanted, state = _wanted(tuner, candidates, pairs)
        hold = _together_hold(tuner, state.inside, state.faster_knobs)
        chosen = _fitting(tuner, candidates, wanted, _left(tuner, state.may_win or hold > 0) - hold)
        if not chosen and not state.winner and not hold:
            # Nothing to verify yet, nor a together comparison to hold for: measuring comes
            # first, with the verification's reserve too but one round of it while a setting
            # reads faster. A hopeful at 1.12x (CI 1.03-1.21, noise 4 %) had four rounds and
            # stopped with 485 s of 1200 left, held for the verification of a winner there was not.
            keep = tuner._one_verify_round() if state.may_win else 0.0
            chosen = _fitting(tuner, candidates, wanted, tuner.opt.budget_s - tuner.spent - keep)
        if not chosen:
            tuner.all_decided = not wanted  # nothing left to learn, rather than no budget for it
            break
        names = ", ".join(f"{candidates[i].knob}={candidates[i].label}" for i in chosen)
        tuner.say(f"another round ({names}): {tuner.opt.budget_s - tuner.spent:.0f} s of the budget left")
        ran = tuner.run_count
        fresh_round(tuner, candidates, chosen, pairs, parity)
        if tuner.run_count == ran:  # a resumed tune: the same line twice read as a stall
            tuner.say("  its trials were in the store (--out): reused")
        parity += 1
    # settings that never got a round stay unmeasured (skipped rows)
    keep = [i for i in range(len(candidates))
            if i < n_admitted or tuner._paired(candidates[i].settings, {}, pairs[i])[0]
            or tuner._paired(candidates[i].settings, {}, pairs[i])[1]]
    late = [candidates[i] for i in keep if i >= n_admitted]
    candidates[:] = [candidates[i] for i in keep]
    pairs[:] = [pairs[i] for i in keep]
    return late


def confirm(tuner: Tuner, row: Any, pairs: list[Pair]) -> None:
    """A setting given more rounds because its first ones read faster (a hopeful) is crowned
    only if the rounds after that choice alone read faster beyond the noise: the rounds that
    chose it are lucky by selection. (Six tunes of six null settings on trials scattered by 15 %:
    judged over all rounds, 6 of 36 null settings were crowned or condemned; at most 2 without
    the extra rounds.)"""
    start = tuner.chosen_after.get(tuner.key(row.settings))
    if start is None or row.verdict != stats.FASTER:
        return
    ok, fresh, need, n = _confirmed(tuner, row.settings, pairs)
    if not ok:
        row.verdict = stats.NO_CHANGE
        if fresh is None:
            # no round of its own was run (it read "the 0 rounds after its first 2 read not measured")
            said = (f"unconfirmed: no round after the first {start} that chose it fit the budget; "
                    "rerun with the same --out and a larger --budget to confirm it")
        else:
            rounds = f"the {n} round{'s' if n != 1 else ''} after its first {start}"
            said = f"{rounds} read {fresh:.2f}x, not beyond the noise ({need:.0%})"
        if row.ci_clears_band:
            # dcgan's channels_last: CI 1.14-1.19 over all rounds, noise 13 %: why it is not a win
            said += ", though the CI over every round clears the band: the rounds that chose it are no proof"
        row.note = (row.note + "; " if row.note else "") + said


def _confirmed(tuner: Tuner, settings: dict[str, Any], pairs: list[Pair],
               round_sd: float | None = None) -> tuple[bool, float | None, float, int]:
    """(whether the rounds since the setting was chosen as a hopeful read faster beyond the
    noise, their speedup, the noise they must clear, how many): confirm's test, also asked
    before the budget's rounds stop, there with `round_sd` pooled over every candidate's rounds
    so far. The tune's own pool fills only when the table's rows are judged: asked with it
    while spending (empty: no noise), pytorch/examples' vae had its 1.31x hopeful stop after 4
    of 6 rounds, "confirmed", with 504 s of 600 left, and the row then demanded 63 % of it."""
    start = tuner.chosen_after.get(tuner.key(settings))
    if start is None:
        return True, None, 0.0, 0
    rounds, _ = tuner._paired(settings, {}, pairs[start:])
    logs = stats.round_log_ratios(arm_of([x for x, _ in rounds]), arm_of([[y] for _, y in rounds]))
    sd = stats.pooled_round_sd(list(tuner.round_logs.values())) if round_sd is None else round_sd
    # CONFIRM_Z, not POOLED_Z: a second look at a setting that had its first one
    need = max(tuner.opt.min_effect, math.exp(CONFIRM_Z * sd / math.sqrt(max(1, len(logs)))) - 1, stats.paired_noise(
        arm_of([x for x, _ in rounds]), arm_of([[y] for _, y in rounds])) if len(logs) > 1 else 0.0)
    fresh = math.exp(sum(logs) / len(logs)) if logs else None
    return fresh is not None and fresh > 1.0 + need, fresh, need, len(logs)


EARLY_END_SHARE = 0.2
"""A tune that ends with more than this share of its budget left says why."""


def early_end_note(tuner: Tuner) -> str | None:
    """Why the tune ended with much of its budget left: its rounds stopped because every setting
    was decided, not for the budget (dcgan's 4m tune ended at 2:35, every setting at 0.92-1.02x,
    and nothing said why the rest was not spent)."""
    left = tuner.opt.budget_s - tuner.spent
    if not tuner.all_decided or left <= EARLY_END_SHARE * tuner.opt.budget_s:
        return None
    return (f"the tune ended with {left:.0f} s of its {tuner.opt.budget_s:.0f} s budget left: every setting read "
            f"faster, slower, or no faster than the {tuner.opt.min_effect:.0%} floor (--min-effect), or had its "
            f"{tuner.opt.max_rounds} rounds (--max-rounds); more rounds would not change these verdicts")


def unused_share(tuner: Tuner) -> float:
    """The share of the budget not spent (0 when overspent)."""
    return max(0.0, 1.0 - tuner.spent / tuner.opt.budget_s) if math.isfinite(tuner.opt.budget_s) else 0.0


__all__ = ["CLEAR_LOSER", "STOP_BELOW", "confirm", "fresh_round", "halve", "offered",
           "planned_trials", "reprice", "spend_rest", "unused_share", "early_end_note"]
