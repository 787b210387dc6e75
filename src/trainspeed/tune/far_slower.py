"""When a trial stopped "far slower" decides a setting, and when it is the machine's load.

A trial still running at SLOW_CUTOFF times its price is stopped (trials.py): fp16 autocast on a
CPU without fp16 units ran 60x slower, and finishing it would eat the budget. On a shared
machine the load alone can do that. makemore's 6-minute tune beside another job: its baseline
trials took 33-55 s against a 4 s first trial, and bf16 and fused AdamW, each stopped at 30 s
in their first round, read "slower" with nothing measured; a newcomer's bf16 ran six rounds
faster, its seventh was stopped after a loaded baseline, and the row read "slower" too. So:

- the cutoff follows the machine: SLOW_CUTOFF times the slowest baseline trial the tune has
  run since its first, when that is above the trial's price (`cutoff_price`);
- a stop decides only where the setting completed no round; rounds that completed are judged,
  and the stops are named in the row's note (`deciding`);
- a setting stopped under a cutoff shorter than that slowest baseline allows is run again in a
  later round, once (`may_run_again`).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from trainspeed.tune.result import repeats_note
from trainspeed.tune.trials import BUDGET_END, FAR_SLOWER, SLOW_CUTOFF, TrialResult

MAX_STOPS = 2
"""A setting stopped far slower this many times is not run again, whatever the load."""


def stopped(result: TrialResult) -> bool:
    """The trial was stopped far slower (not a crash, an OOM or the budget's end)."""
    return not result.ok and (result.error or "").startswith(FAR_SLOWER)


def budget_cut(result: TrialResult) -> bool:
    """The trial was cut by the tune's budget's end: nothing said of its setting (a resumed tune
    with a larger --budget, what the cut's note asks for, runs it again)."""
    return not result.ok and (result.error or "").startswith(BUDGET_END)


def slowest_baseline(baseline: Iterable[TrialResult]) -> float:
    """Wall seconds of the slowest completed baseline trial after the first (that one counts
    FLOPs, or ran at another length): how slow the machine has made a plain trial."""
    return max((r.wall_s for r in baseline if r.ok and r.repeat > 0), default=0.0)


def cutoff_price(price: float, baseline: Iterable[TrialResult]) -> float:
    """The wall time a trial is priced at for its far-slower cutoff."""
    return max(price, slowest_baseline(baseline))


def deciding(failed: Sequence[TrialResult], completed_rounds: int,
             baseline: Iterable[TrialResult] = ()) -> list[TrialResult]:
    """The failures that decide a comparison: every crash; stops only where no round of the
    setting completed, and only those that ran at least as long as the slowest `baseline` trial
    since the first: a stop before the plain script's own time shows nothing slower
    (reinforce.py's episodes lengthen: its trials were priced ~6 s from the first trial's short
    episodes, bf16 was stopped at 30 s while baseline trials took 28-43 s, and the row read
    "slower" with nothing measured)."""
    crashes = [r for r in failed if not stopped(r)]
    if crashes:
        return list(failed)
    if completed_rounds:
        return []
    slowest = slowest_baseline(baseline)
    return [r for r in failed if not r.wall_s < slowest]


def unmeasured_note(results: Iterable[TrialResult], pairs: Sequence[tuple[tuple[int, ...], int]],
                    baseline: Iterable[TrialResult]) -> str:
    """The note of a row with no completed round and nothing deciding: every stop of its trials
    (those of `pairs`) came before the slowest baseline trial's time (`deciding` left them out),
    or the budget ran out before its trial."""
    slowest = slowest_baseline(baseline)
    ran = {c for _, c in pairs}
    stops = [r for r in results if r.repeat in ran and stopped(r)]
    if not stops or any(not r.wall_s < slowest for r in stops):
        return "budget ran out before this trial"
    return (f"stopped as far slower after {max(r.wall_s for r in stops):.0f} s, while plain baseline trials took up to "
            f"{slowest:.0f} s: nothing measured, no verdict (the cutoff came from a shorter first trial); rerun with "
            "the same --out and a larger --budget to measure it")


def may_run_again(earlier: Sequence[TrialResult], baseline: Iterable[TrialResult], *, reference: bool = False) -> bool:
    """Whether a setting is run in a later round: it never failed, or each failure was a stop
    that the machine's slowest baseline since explains (its trial ran for less than SLOW_CUTOFF
    times that baseline), fewer than MAX_STOPS of them. The `reference` (the baseline, which every
    round compares against) runs again after fewer than MAX_STOPS failures where one of its
    trials completed: its crash is then no verdict on it. super_resolution's baseline ran 13
    trials, then one crashed (trainspeed's own import, mid-edit); every later round and the
    resumed tunes' verifications skipped the baseline, and the compile winner read "the budget
    ran out before a fresh verification" with 95 s of 6 minutes left, twice."""
    failed = [r for r in earlier if not r.ok and not budget_cut(r)]
    if not failed:
        return True
    if reference and any(r.ok for r in earlier):
        return len(failed) < MAX_STOPS
    if len(failed) >= MAX_STOPS or not all(stopped(r) for r in failed):
        return False
    slowest = slowest_baseline(baseline)
    return all(r.wall_s < SLOW_CUTOFF * slowest for r in failed)


def judged_now(results: Iterable[TrialResult], ran: set, retried: set) -> list[TrialResult]:
    """`results` less the crashes an earlier tune into this --out stored that this tune has not
    yet run again: a resumed tune runs a crashed setting once more (a crash may be transient: a
    library mid-upgrade, a neighbour's OOM kill) before that crash is its verdict. `ran`: (key,
    repeat) run or reused by this tune; `retried`: keys it ran again."""
    return [r for r in results if r.ok or stopped(r) or (r.key, r.repeat) in ran or r.key in retried]


def rounds_note(note: str | None, completed: int, planned: int, why: str, results: Iterable[TrialResult]) -> str | None:
    """A row's note on its rounds: fewer than planned, and why (the budget, a drop), and the
    stops its verdict leaves out (not counted as the budget's: a cut by the budget changes how
    its verification is read, result.cut_by_budget)."""
    n = sum(1 for r in results if stopped(r))
    said = [note] if note else []
    if completed + n < planned:
        said.append(repeats_note(completed, planned, why))
    if n:
        said.append(f"{n} trial{'s' if n > 1 else ''} stopped far slower, left out: judged on the {completed} "
                    f"round{'s' if completed > 1 else ''} that completed")
    return "; ".join(said) if said else note
