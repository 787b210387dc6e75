"""The order the ablation runs its trials in: which baseline trials stand around which
candidate, round by round. Pure functions of indices, so the order is tested on its own and a
resumed tune computes the same repeat numbers.

Round r (every=2): B C1 C2 B C3 C4 B. The baseline runs before each group of `every`
candidates and after the last, and each candidate is compared with the two baseline trials
around it (see search.py for why).
"""

from __future__ import annotations

from typing import Any

from trainspeed.tune.knobs import Candidate


def n_brackets(n_candidates: int, every: int) -> int:
    """Baseline trials per ablation round: one before each group of `every` candidates and
    one after the last (1 with no candidates)."""
    return -(-n_candidates // every) + 1


def bracket_repeats(i: int, r: int, repeats: int, every: int, first: int = 0) -> tuple[int, int]:
    """The baseline repeats that run just before and after candidate i in round r. Bracket j
    of round r is repeat first + j * repeats + r: bracket 0 keeps the numbers that one baseline
    per round had, and a resumed tune with more candidates adds brackets without renumbering.
    `first` is 1 where the first baseline trial (repeat 0) ran another length than the sized
    trials (a script's pricing trial, Tuner.first_bracket): it opens no round."""
    g = i // every
    return first + g * repeats + r, first + (g + 1) * repeats + r


def ablation_round(candidates: list[Candidate], r: int, repeats: int, every: int, idle: frozenset[int] = frozenset(),
                   first: int = 0) -> list[tuple[dict[str, Any], str, int]]:
    """Round r: B C1 C2 B C3 C4 B (every=2; repeat r of every candidate, bracket j of the
    baseline is repeat j * repeats + r). Odd rounds run the groups in reverse order but keep
    the order inside each group: B C3 C4 B C1 C2 B. A candidate then runs next to its left
    bracket in one round and next to its right one in the other, so a drift that bends
    between brackets errs one way in one round and the other way in the next, and shows as
    the spread between rounds instead of a bias (reversing the whole round would keep every
    candidate next to the same bracket).

    `idle`: indices of candidates this round does not run (dropped after an earlier round,
    or failed); a baseline bracket with no running candidate on either side is left out too.
    makemore on the loaded 2-core machine: after round 1 dropped both settings of one group,
    round 2 still ran that group's bracket, a 33 s baseline trial next to nothing, out of 600 s.
    `first`: as for bracket_repeats."""
    def baseline(j: int) -> tuple[dict[str, Any], str, int]:
        return {}, "baseline", first + j * repeats + r

    groups = [list(range(g, min(g + every, len(candidates)))) for g in range(0, len(candidates), every)]
    if not groups:
        return [baseline(0)]
    odd = r % 2 == 1
    order = list(range(len(groups)))[::-1] if odd else list(range(len(groups)))
    live = [any(i not in idle for i in group) for group in groups]
    if not any(live):
        return []

    def needed(j: int) -> bool:  # bracket j stands between groups j-1 and j
        return (j > 0 and live[j - 1]) or (j < len(groups) and live[j])

    opening = order[0] + 1 if odd else 0
    arms = [baseline(opening)] if needed(opening) else []
    for g in order:
        arms += [(candidates[i].settings, f"{candidates[i].knob}={candidates[i].label}", r)
                 for i in groups[g] if i not in idle]
        j = g if odd else g + 1
        if needed(j):
            arms.append(baseline(j))
    return arms
