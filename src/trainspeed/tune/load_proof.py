"""Load-proof winners: a comparison whose candidate and reference trials saw different load
from other processes is repeated, and a winner must hold on rounds whose loads match.

Every script trial reads the other processes' CPU from the doctor's system sampler
(TrialResult.others_load, cores). A neighbour's burst that lands on the reference trials and
not on the candidate's reads as a win: a GAN example's threads=1 was "verified 18.4x" on a
busy machine and measured 1.0-1.4x alternated on a quieter one; the tune's note said the
machine was busy, but the winner and its patch stood. Now a winning comparison's rounds whose
loads differ are run again (fresh repeats of both, interleaved); the verdict is taken on the
matched rounds alone, and with fewer matched rounds than planned the row reads "not
measurable while the machine is busy": not a winner, so nothing reaches best.yaml or
best.patch on that evidence. The verification goes through the same check.

Loads match when the cores left free differ by at most LOAD_MATCH_RATIO: a busy loop on one
of two cores halves what the script gets; 0.3 of 16 cores changes nothing. A win also stands on
a round whose candidate had fewer cores free than its references (load_fair_to_win): the load
was against it.
"""

from __future__ import annotations

from typing import Any

from trainspeed.tune import stats
from trainspeed.tune.result import Row
from trainspeed.tune.trials import TrialResult

LOAD_MATCH_RATIO = 1.25
"""Largest ratio of free cores (cores - others' load) between a candidate's trial and its
reference's for the two to count as run on the same machine."""
LOAD_RETRIES = 3
"""Times the rounds whose loads differed are run again (fresh repeats of both sides) before the
row reads "not measurable while the machine is busy"."""
MIN_FREE_CORES = 0.25
"""Free cores are read as at least this (a saturated machine is not infinitely worse)."""

Pair = tuple[tuple[int, ...], int]


def loads_match(reference: list[float | None], candidate: float | None, cores: int) -> bool:
    """Whether a candidate trial's load matches each of its reference trials': True when
    either side was not sampled (nothing to judge by). Each, not their mean: a bracket of one
    loaded baseline (0.73 cores of others) and one quiet one averaged to a load that matched
    the quiet candidate's (makemore's foreach read 1.87x from it)."""
    known = [x for x in reference if x is not None]
    if candidate is None or not known:
        return True
    free_cand = max(MIN_FREE_CORES, cores - candidate)
    for load in known:
        free_ref = max(MIN_FREE_CORES, cores - load)
        if max(free_ref, free_cand) / min(free_ref, free_cand) > LOAD_MATCH_RATIO:
            return False
    return True


def load_fair_to_win(reference: list[float | None], candidate: float | None, cores: int) -> bool:
    """Whether a candidate's win over its reference trials cannot be the load's: loads_match, or
    the candidate ran with no more free cores than any reference (beyond LOAD_MATCH_RATIO). A
    neighbour's burst on the reference trials reads as a win (the case load-proofing exists
    for); one on the candidate's only slows it, so a win through it stands. A setting that
    uses fewer cores (threads=1, one DataLoader worker with one thread) leaves cores that
    neighbours with work then take: its trials read more load from others than the baseline's
    whatever the machine does. A win on a freer machine is still refused (mnist_rnn's
    num_workers=1, 5.42x, whose 1-thread trials saw less load than the baselines)."""
    if loads_match(reference, candidate, cores):
        return True
    free_cand = max(MIN_FREE_CORES, cores - candidate)  # type: ignore[operator]  # known: loads_match
    return all(free_cand <= max(MIN_FREE_CORES, cores - load) * LOAD_MATCH_RATIO
               for load in reference if load is not None)


def load_matched(rounds: list[tuple[list[TrialResult], TrialResult]], cores: int
                 ) -> list[tuple[list[TrialResult], TrialResult]]:
    """The rounds (reference trials, candidate trial) whose trials saw the same load from other
    processes: the only ones the machine's noise pool may take. A round that set a loaded
    trial beside a quiet one measured the load, not the noise (makemore beside a neighbour of
    75 s in a 4-minute tune: the pool read 32-62 % and every setting "no measurable change")."""
    return [(refs, c) for refs, c in rounds if loads_match([r.others_load for r in refs], c.others_load, cores)]


class LoadProof:
    """Mixed into search.Tuner: its store, keys, rounds and rows (kept out of search.py)."""

    def _trials_of(self, settings: dict[str, Any], repeats: tuple[int, ...]) -> list[TrialResult]:
        key = self._key(settings)  # type: ignore[attr-defined]
        return [r for i in repeats if (r := self.store.get(key, i)) is not None and r.ok]  # type: ignore[attr-defined]

    def _matched(self, reference: dict[str, Any], settings: dict[str, Any], pair: Pair) -> bool | None:
        """Whether a round's loads leave its candidate's win standing (load_fair_to_win); None
        when the round did not run."""
        refs, c = pair
        ref, cand = self._trials_of(reference, refs), self._trials_of(settings, (c,))
        if not ref or not cand:
            return None
        return load_fair_to_win([r.others_load for r in ref], cand[0].others_load, self.device.cores)  # type: ignore[attr-defined]

    def _fresh(self, settings: dict[str, Any], used: list[int], n: int) -> list[int]:
        """`n` repeat numbers of `settings` no phase of the search has given out."""
        key = self._key(settings)  # type: ignore[attr-defined]
        start = max([self.next_repeat.get(key, self.opt.repeats), *(i + 1 for i in used)])  # type: ignore[attr-defined]
        self.next_repeat[key] = start + n  # type: ignore[attr-defined]
        return list(range(start, start + n))

    def _load_proof(self, row: Row, reference: dict[str, Any], pairs: list[Pair]) -> Row:
        """A winning row whose rounds saw different loads, judged again on matched rounds."""
        if row.verdict != stats.FASTER:
            return row
        settings = row.settings
        bad = [p for p in pairs if self._matched(reference, settings, p) is False]
        if not bad:
            return row
        # a setting the search stopped repeating (dropped for the budget) is not run again: its
        # reference trial alone was run for it, beside nothing (makemore's num_workers=1, 41 s of 600)
        dropped = self._key(settings) in self.dropped  # type: ignore[attr-defined]
        self.say(f"  {row.knob}={row.setting}: other processes' load differed from its reference's "  # type: ignore[attr-defined]
                 f"in {len(bad)} of {len(pairs)} rounds; " + ("not repeated (dropped)" if dropped else "repeating them"))
        # Rounds still unmatched are run again, up to LOAD_RETRIES times while the budget pays
        # (a trial the budget cannot pay is not run: its round stays unmatched): a neighbour's
        # burst that outlasts one repeat does not refuse a real winner (issue 33: spend the
        # budget, never refuse a winner for noise).
        fresh: list[Pair] = []
        used_refs, used_cands = [i for p in pairs for i in p[0]], [p[1] for p in pairs]
        missing, attempts = len(bad), 0
        while not dropped and missing > 0 and attempts < LOAD_RETRIES:
            attempts += 1
            refs = self._fresh(reference, used_refs, missing)
            cands = self._fresh(settings, used_cands, missing)
            used_refs, used_cands = [*used_refs, *refs], [*used_cands, *cands]
            batch = [((r,), c) for r, c in zip(refs, cands)]
            for i, ((r,), c) in enumerate(batch):
                self._round([(reference, "current" if reference else "baseline", r), (settings, row.setting, c)],  # type: ignore[attr-defined]
                            reverse=bool(i % 2))
            fresh += batch
            outcome = [self._matched(reference, settings, p) for p in batch]
            missing -= sum(1 for m in outcome if m)
            if any(m is None for m in outcome):
                break  # the budget ran out
            if missing > 0 and attempts < LOAD_RETRIES:
                self.say(f"  {row.knob}={row.setting}: the load still differed in {missing} round(s); "  # type: ignore[attr-defined]
                         "repeating them again")
        matched = [p for p in [*pairs, *fresh] if p not in bad and self._matched(reference, settings, p)]
        # its first reading leaves the machine's noise pool: a round that compared a loaded
        # trial with a quiet one measured the load, and the re-judged rows count their own
        self.round_logs.pop((row.knob, row.setting, self._key(reference), self._key(settings),  # type: ignore[attr-defined]
                             tuple(c for _, c in pairs)), None)
        if len(matched) < len(pairs):
            return Row(knob=row.knob, setting=row.setting, settings=settings, cost_factor=row.cost_factor,
                       verdict=stats.BUSY, speedup=row.speedup, ci=row.ci, noise=row.noise,
                       noise_from=row.noise_from, loss_delta=row.loss_delta, loss_deltas=row.loss_deltas,
                       memory_ratio=row.memory_ratio,
                       note=f"read {row.speedup:.2f}x, but other processes' load differed between it and its "
                            f"reference in {len(bad)} of {len(pairs)} rounds and "
                            + ("it was not repeated (dropped for the budget)" if dropped
                               else f"still in {missing} after {attempts} repeat(s)")
                            + f" ({len(matched)} matched rounds): not kept")
        again = self.row(row.knob, row.setting, settings, reference, cost_factor=row.cost_factor,  # type: ignore[attr-defined]
                         pairs=matched, proof=False)
        said = f"judged on the {len(matched)} rounds whose loads matched ({len(bad)} repeated)"
        again.note = f"{again.note}; {said}" if again.note else said
        return again


__all__ = ["LOAD_MATCH_RATIO", "LOAD_RETRIES", "LoadProof", "load_fair_to_win", "load_matched", "loads_match"]
