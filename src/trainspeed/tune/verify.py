"""The tune's last step: the best settings against the baseline, in fresh interleaved rounds,
compared with each other only: what the user gets.

Its trials run B X B X ... B (B: the baseline, X: the best config), and each X is compared with
the B trials on either side of it (the last X with the one before it where the budget's end left
out the one after), as the ablation's candidates are with their brackets (order.py): a drift
cancels, and a slow spell of the machine as long as two trials lands on both arms. The rounds
were pairs run B X, X B, B X: the B of one round next to the B of the next, and one spell of
slow disk writes across those two (a script saving 8 MB every other step) read as two winning
rounds of a null edit, 2.0x and 2.4x, verified "faster" at 1.6-1.8x in 3 of 7 runs on a quiet
machine. The budget's reserve is still two trials a round: the closing B is the one the
budget's end may leave out.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

from trainspeed.tune import stats
from trainspeed.tune.arms import arm_of
from trainspeed.tune.result import Row, cut_by_budget
from trainspeed.tune.spend import CONFIRM_Z
from trainspeed.tune.student_t import t_critical

VERIFY_OFF = "the verification is off (--verify-repeats 0)"

Tuner = Any
"""search.Tuner, which imports this module (its trials, rounds and budget are read here)."""


def verify(tuner: Tuner, best: dict[str, Any], backed: Row | None = None) -> Row:
    """Fresh interleaved repeats of the baseline and the best config as `verify_as` runs it (a
    script's what-if: best.patch's edit), compared with each other only: what the user gets.
    `backed`: the ablation's row that found (part of) `best` faster beyond the noise (_backed)."""
    if tuner.opt.verify_repeats:
        tuner.say("verifying the combination against the baseline")
    ran, best = best, tuner.verify_as(best)  # its own key: a resumed tune never reads the what-if's as the edit's
    tuner.cost_factor.setdefault(tuner._key(best), tuner.cost_factor.get(tuner._key(ran), 1.0))
    took = [r.wall_s for r in tuner.results(best) if r.ok and r.wall_s > 0] if ran == best and tuner.opt.verify_repeats else []
    if took and tuner.base_wall > 0:
        # priced from what its trials took, not its knob's prior: compile's 3 baseline trials
        # priced a 58 s trial at 174 s, and the rounds' brackets left no round after the first
        tuner.cost_factor[tuner._key(best)] = statistics.median(took) / tuner.base_wall
    R = tuner.opt.repeats
    V = tuner.opt.verify_repeats
    base_key, best_key = tuner._key({}), tuner._key(best)
    n_base, n_best = tuner.next_repeat.get(base_key, R), tuner.next_repeat.get(best_key, R)
    if V and tuner.store.get(best_key, n_best) is None:
        # Not verified before. A resumed tune whose winners changed finds the baseline's
        # repeats at n_base.. already stored, run beside the old best: take the next ones.
        n_base = max([n_base] + [r.repeat + 1 for r in tuner.results({})])
    # B X B X ... B: an opening bracket, then each round's X and the B after it (X first: where the
    # budget's end cuts a round, the comparison keeps its X against the B before it)
    if V:
        tuner._round([({}, "baseline", n_base)], reverse=False)
    for v in range(V):
        _bracketed(tuner, best, n_best + v, n_base + v + 1)
    pairs = lambda n: [((n_base + i, n_base + i + 1), n_best + i) for i in range(n)]  # noqa: E731 - the first n rounds
    verified = lambda n: _verified(tuner, best, pairs(n))  # noqa: E731
    if not V:  # not "the budget ran out": the user asked for no verification
        return Row(knob="combined", setting=tuner.describe(best), settings=best, verdict=stats.SKIPPED, note=VERIFY_OFF)
    row = verified(V)
    # Undecided, reading faster, and a round still fits: more rounds, up to --max-rounds.
    # timm's bf16, faster alone at 1.33x (CI 1.16-1.40), verified at 1.28x with a CI of
    # 0.99-1.52 over three rounds and was refused, with budget left to decide it.
    v = V
    while (V and row.verdict == stats.NO_CHANGE and row.speedup is not None
           and row.speedup > 1.0 + tuner.opt.min_effect and v < max(V, tuner.opt.max_rounds)
           and 2 * tuner.base_wall <= tuner.opt.budget_s - tuner.spent):
        tuner.say(f"the verification reads {row.speedup:.2f}x, inside the noise: another round "
                  f"({tuner.opt.budget_s - tuner.spent:.0f} s of the budget left)")
        _bracketed(tuner, best, n_best + v, n_base + v + 1)
        v += 1
        row = verified(v)
    # the ablation backs what it measured: not an edit run in its place (verify_as), whose
    # reading is the question (a null edit read 1.18x inside the noise beside the what-if's
    # 6.03x, and was kept "on the ablation")
    return _backed(tuner, row, backed, pairs(v)) if backed and ran == best else row


def _bracketed(tuner: Tuner, best: dict[str, Any], repeat: int, closing: int) -> None:
    """One verification round: the best config's trial, then the baseline trial that closes its
    bracket, only where that trial ran (a bracket around nothing pays for nothing)."""
    tuner._round([(best, "best", repeat)], reverse=False)
    done = tuner.store.get(tuner._key(best), repeat)
    if done is not None and done.ok:
        tuner._round([({}, "baseline", closing)], reverse=False)


def _backed(tuner: Tuner, row: Row, won: Row, pairs: list[tuple[tuple[int, ...], int]]) -> Row:
    """A verification that read faster, its whole interval above 1, yet inside its rounds' noise
    band, of settings the ablation found faster beyond the noise: both say faster, so it is kept
    (then judged on matched loads, as every winner is). word_language_model's fused AdamW read
    1.18x alone (CI 1.07-1.25), then 1.07x (CI 1.02-1.12) over 12 verification rounds in a ±10 %
    band, and was refused, while the same reading from a verification cut by the budget was kept
    (budget_cut): a fuller verification must not refuse what a shorter one keeps."""
    if not row.faster_inside_noise or cut_by_budget(row):  # cut short: budget_cut's answer says so
        return row
    if (row.speedup or 0.0) <= 1.0 + tuner.opt.min_effect:  # faster, but not by the floor a win needs
        return row
    band = f" (±{row.noise:.0%})" if row.noise is not None else ""
    kept = dataclasses.replace(row, verdict=stats.FASTER, note=(
        f"its interval lies above 1 but inside this machine's run-to-run noise{band}; kept on that and the "
        f"ablation, where {won.knob}={won.setting} read {won.speedup:.2f}x beyond the noise"))
    return tuner._load_proof(kept, {}, pairs)


def _verified(tuner: Tuner, best: dict[str, Any], pairs: list[tuple[tuple[int, ...], int]]) -> Row:
    """The verification's row. Its one comparison is also judged by its rounds' mean: faster
    when the mean log speedup clears the standard errors of the rounds that Student's t asks at
    spend.CONFIRM_Z's tail (19.2 of 3 rounds, 5.5 of 6: their standard deviation is their own),
    though the rounds disagree by more than the gain (timm's bf16: 1.14-1.55x in six rounds, all
    faster, read "no measurable change" against their 21 % spread)."""
    row = tuner.row("combined", tuner.describe(best), best, {}, pairs=pairs)
    if row.verdict != stats.NO_CHANGE or len(pairs) < 3:
        return row
    rounds, failed = tuner._paired(best, {}, pairs)
    logs = stats.round_log_ratios(arm_of([refs for refs, _ in rounds]), arm_of([[c] for _, c in rounds]))
    if failed or len(logs) < 3:
        return row
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    z = mean / (sd / math.sqrt(len(logs))) if sd > 0 else math.inf
    # the standard deviation is these few rounds' own: Student's t at CONFIRM_Z's tail (student_t.py)
    need = t_critical(CONFIRM_Z, len(logs) - 1)
    if mean > math.log1p(tuner.opt.min_effect) and z >= need:
        row.verdict = stats.FASTER
        row.note = (f"every round's speedup {min(math.exp(x) for x in logs):.2f}-{max(math.exp(x) for x in logs):.2f}x; "
                    f"their mean {math.exp(mean):.2f}x clears {need:.1f} standard errors of its "
                    f"{len(logs)} rounds (Student's t at the tail of {CONFIRM_Z:g})") if min(logs) > 0 else (
                    f"the mean of its {len(logs)} rounds, {math.exp(mean):.2f}x, clears {need:.1f} "
                    f"standard errors (Student's t at the tail of {CONFIRM_Z:g})")
        row = tuner._load_proof(row, {}, pairs)  # a winner's rounds must have seen matching loads
    return row


def budget_cut(final: Row | None) -> bool:
    """Did the budget, not the user (--verify-repeats 0) or a measurement, leave the
    verification unrun, or cut it short while it read faster, its interval above 1, inside
    the noise of its few rounds? nanoGPT's compile won its ablation at 1.09x over four rounds,
    and its verification, cut to 2 of 3 rounds, read 1.10x (CI 1.06-1.14) against a 6 % spread
    of those two: nothing was kept."""
    if final is None:
        return False
    if final.verdict == stats.SKIPPED:
        return final.note != VERIFY_OFF
    return final.verdict == stats.NO_CHANGE and cut_by_budget(final) and final.ci is not None and final.ci[0] > 1.0


def ablation_answer(tuner: Tuner, ablation: list[Row], cut: Row | None = None) -> tuple[Row, dict[str, Any]] | None:
    """When the budget ran out before the verification: the fastest setting that won its
    ablation comparison against the baseline, as the answer (its row, its settings), said to
    be measured there and not afresh. None when no setting won. A tune that measured a 10x
    winner (16 DataLoader workers' trial took the verification's time on an H100) reported
    no answer at all and kept the baseline."""
    winners = [r for r in ablation if r.verdict == stats.FASTER and r.speedup and not tuner.is_whatif(r.settings)]
    if not winners:
        return None
    won = max(winners, key=lambda r: r.speedup or 0.0)
    left = tuner.opt.budget_s - tuner.spent
    why = (f"the budget ran out before a fresh verification ({max(left, 0.0):.0f} s left)" if cut is None else
           f"the verification, cut short by the budget, read {cut.speedup:.2f}x (CI {cut.ci[0]:.2f}-{cut.ci[1]:.2f}), "
           f"faster but inside the spread of its few rounds (±{cut.noise:.0%})")
    return unverified_answer(tuner, won, f"{won.knob}={won.setting} as measured against the baseline in the "
                                         f"ablation: {why}; rerun with the same --out and a larger --budget to verify it")


def unverified_answer(tuner: Tuner, won: Row, note: str) -> tuple[Row, dict[str, Any]]:
    """A setting's own row as the tune's answer, not verified afresh (said in `note`), and its
    settings; labelled by them, as a verified row is ("combined | 1" said nothing of threads)."""
    row = dataclasses.replace(won, knob="combined", setting=tuner.describe(won.settings), settings=dict(won.settings),
                              unverified=True, note=note)
    return row, dict(won.settings)


def final_answer(tuner: Tuner, best: dict[str, Any], ablation: list[Row]) -> tuple[Row | None, dict[str, Any]]:
    """The tune's answer: the best settings verified afresh against the baseline; where the
    budget left that unrun, the ablation's fastest winner, said so (ablation_answer)."""
    backing = [r for r in ablation if r.verdict == stats.FASTER and r.speedup and r.settings
               and all(best.get(k, object()) == v for k, v in r.settings.items())]
    final = verify(tuner, best, max(backing, key=lambda r: r.speedup or 0.0, default=None)) if best else None
    answer = (ablation_answer(tuner, ablation, final if final.verdict != stats.SKIPPED else None)
              if final is not None and budget_cut(final) else None)
    return answer if answer is not None else (final, best)


__all__ = ["ablation_answer", "budget_cut", "final_answer", "verify"]
