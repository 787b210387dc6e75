"""The search: every knob alone from the baseline (the ablation table), then the winners
combined greedily, then the combination verified against the baseline.

    tuner = Tuner(base_config=cfg_dict, device=DeviceInfo.detect(), runner=runner,
                  store=TrialStore(out), options=TuneOptions(knobs=["precision", ...]))
    result = tuner.run()

Trials of competing settings are interleaved: repeat r of the baseline and of every
candidate run in one round, and odd rounds run in reverse order, so a machine that slows
down (thermal, a neighbour's job) slows every arm alike instead of favouring the first.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from trainspeed.config_io import apply_overrides
from trainspeed.errors import TrainspeedError
from trainspeed.tune import stats
from trainspeed.tune.knobs import KNOBS, Candidate, DeviceInfo, KnobContext, Skip
from trainspeed.tune.store import TrialStore
from trainspeed.tune.trials import FAR_SLOWER, SLOW_CUTOFF, Runner, TrialRequest, TrialResult, overrides_of

MIN_CUTOFF_S = 30.0
"""Never stop a trial before this: process start-up dominates a short baseline."""


class TuneError(TrainspeedError):
    """The tune cannot proceed (e.g. the baseline itself fails)."""


@dataclass(kw_only=True)
class TuneOptions:
    knobs: list[str] = field(default_factory=lambda: list(KNOBS))
    """Knobs to measure, in priority order (the budget cuts from the end)."""
    budget_s: float = 600.0
    """Wall-clock budget for all trials; knobs whose estimated cost does not fit are skipped."""
    repeats: int = 2
    """Interleaved repeats of every setting in the ablation (>= 2 measures run-to-run noise)."""
    verify_repeats: int = 3
    """Interleaved rounds of baseline and best config in the final verification, which decides
    best.yaml. Three, not two: the noise is the spread of the speedup between rounds, and two
    rounds give one spread, a noisy estimate of it (a VM read 1.05x and 1.17x in two rounds and
    refused a combination each step of which had been faster)."""
    loss_tolerance: float = 0.05
    """A setting whose parity loss is worse than the baseline's by more than this share fails."""
    min_effect: float = 0.03
    """Smallest relative change ever called a speedup, whatever the measured noise."""

    def __post_init__(self) -> None:
        from trainspeed.errors import ConfigError

        if self.repeats < 1 or self.verify_repeats < 0:
            raise ConfigError(f"tune: repeats must be >= 1 and verify_repeats >= 0, got "
                              f"{self.repeats} and {self.verify_repeats}")
        if self.budget_s <= 0:
            raise ConfigError(f"tune: budget must be > 0 seconds, got {self.budget_s}")


@dataclass(kw_only=True)
class Row:
    """One line of the ablation table (or of the greedy combination)."""

    knob: str
    setting: str
    settings: dict[str, Any] = field(default_factory=dict)
    verdict: str = stats.SKIPPED
    speedup: float | None = None
    ci: tuple[float, float] | None = None
    noise: float | None = None
    memory_ratio: float | None = None
    """Candidate peak memory / reference peak memory."""
    loss_delta: float | None = None
    note: str = ""
    cost_factor: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"knob": self.knob, "setting": self.setting, "settings": self.settings,
                "verdict": self.verdict, "speedup": self.speedup,
                "ci": list(self.ci) if self.ci else None, "noise": self.noise,
                "memory_ratio": self.memory_ratio, "loss_delta": self.loss_delta, "note": self.note}


@dataclass(kw_only=True)
class TuneResult:
    ablation: list[Row]
    combination: list[Row]
    """Greedy steps: each winner measured on top of the ones accepted before it."""
    best_settings: dict[str, Any]
    final: Row | None
    """The best config verified against the baseline."""
    baseline_cost_s: float
    trials_run: int
    trials_reused: int
    elapsed_s: float
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"schema": 1, "ablation": [r.as_dict() for r in self.ablation],
                "combination": [r.as_dict() for r in self.combination],
                "best_settings": self.best_settings,
                "final": self.final.as_dict() if self.final else None,
                "baseline_cost_s_per_sample": self.baseline_cost_s,
                "trials_run": self.trials_run, "trials_reused": self.trials_reused,
                "elapsed_s": self.elapsed_s, "notes": self.notes}


def config_key(base_hash: str, settings: dict[str, Any]) -> str:
    blob = json.dumps([base_hash, sorted(settings.items())], default=str, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def apply_settings(config: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    return apply_overrides(config, list(overrides_of(settings)))


class Tuner:
    def __init__(self, *, base_config: dict[str, Any], base_hash: str, device: DeviceInfo,
                 runner: Runner, store: TrialStore, options: TuneOptions,
                 block_classes: list[str] | None = None, say: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.monotonic):
        self.base_config = base_config
        self.base_hash = base_hash
        self.device = device
        self.runner = runner
        self.store = store
        self.opt = options
        self.block_classes = block_classes or []
        self.say = say
        self.clock = clock
        self.t0 = clock()
        self.spent = 0.0  # wall seconds of trials actually run (reused ones cost nothing)
        self.run_count = 0
        self.reused = 0
        self.base_wall = 0.0  # wall time of the first baseline trial: the price of a trial
        self.cost_factor: dict[str, float] = {}  # config key -> expected cost vs the baseline
        # config key -> next unused repeat number: every on-top comparison runs fresh repeats of
        # its reference, interleaved with the candidate's (the ablation used 0..R-1). Assigned
        # in the search's own order, so a resumed tune finds the same numbers in its store.
        self.next_repeat: dict[str, int] = {}
        self.ran: set[tuple[str, int]] = set()  # (key, repeat) run or reused in this tune

    # ------------------------------------------------------------------ trials
    def _over_budget(self, key: str | None = None) -> bool:
        """True when the next trial (priced from the baseline's wall time) would end past the
        budget: a trial is never started that the budget cannot pay for."""
        cost = self.base_wall * self.cost_factor.get(key or "", 1.0)
        return self.spent + cost > self.opt.budget_s

    def trial(self, settings: dict[str, Any], label: str, repeat: int) -> TrialResult | None:
        """Run (or reuse) one repeat of base+settings; None when the budget is spent."""
        key = config_key(self.base_hash, settings)
        done = self.store.get(key, repeat)
        if done is not None:
            if (key, repeat) not in self.ran:
                self.ran.add((key, repeat))  # count each earlier trial once, not per lookup
                self.reused += 1
            return done
        if self._over_budget(key):
            return None
        cutoff = None
        if self.base_wall:  # known after the baseline: a far slower trial is stopped early
            cutoff = max(MIN_CUTOFF_S, SLOW_CUTOFF * self.base_wall * self.cost_factor.get(key, 1.0))
        request = TrialRequest(key=key, label=label, overrides=overrides_of(settings), repeat=repeat,
                               timeout_s=cutoff)
        self.say(f"  trial {label} (repeat {repeat + 1}) ...")
        result = self.runner(request)
        self.spent += result.wall_s
        self.run_count += 1
        self.store.add(result)
        self.ran.add((key, repeat))
        if result.ok:
            cost = stats.arm_cost(_arm([result]))
            self.say(f"    {1e3 * cost:.3f} ms/sample, loss {_fmt(result.loss)}, {result.wall_s:.1f} s")
        else:
            self.say(f"    failed: {(result.error or '').splitlines()[0] if result.error else ''}")
        return result

    def results(self, settings: dict[str, Any]) -> list[TrialResult]:
        """Every stored repeat of base+settings, in repeat order."""
        key = config_key(self.base_hash, settings)
        out, r = [], 0
        while (res := self.store.get(key, r)) is not None:
            out.append(res)
            r += 1
        return out

    def _round(self, arms: list[tuple[dict[str, Any], str, int]], reverse: bool) -> None:
        """One interleaved round: each arm's given repeat, in order (or reversed)."""
        for settings, label, repeat in (list(reversed(arms)) if reverse else arms):
            previous = self.results(settings)[:repeat]
            if any(not r.ok for r in previous):
                continue  # a setting that crashed once is not run again
            self.trial(settings, label, repeat)

    # ------------------------------------------------------------------ comparison
    def row(self, knob: str, label: str, settings: dict[str, Any], reference: dict[str, Any],
            *, cost_factor: float = 1.0, ref_repeats: range, cand_repeats: range) -> Row:
        """Candidate vs reference on the given repeats of each: the ones that ran interleaved
        with each other. A config's other repeats ran minutes away, in another phase of the
        search (a baseline's verification repeats, a winner's repeats as the reference of a
        later comparison), on another machine state; pooling them moved verdicts."""
        planned = len(cand_repeats)
        ref = [r for r in self.results(reference) if r.ok and r.repeat in ref_repeats]
        cand_all = [r for r in self.results(settings) if r.repeat in cand_repeats]
        row = Row(knob=knob, setting=label, settings=settings, cost_factor=cost_factor)
        failed = [r for r in cand_all if not r.ok]
        if failed:
            error = failed[0].error or "failed"
            row.verdict = stats.SLOWER if error.startswith(FAR_SLOWER) else stats.FAILED
            row.note = error
            return row
        cand = [r for r in cand_all if r.ok]
        # Round i ran ref_repeats[i] beside cand_repeats[i]: compare those pairs only (the
        # noise is the spread of their ratios), so a round the budget cut short drops out whole.
        ref_at = {r.repeat - ref_repeats.start: r for r in ref}
        cand_at = {r.repeat - cand_repeats.start: r for r in cand}
        rounds = sorted(set(ref_at) & set(cand_at))
        if not rounds:
            row.verdict, row.note = stats.SKIPPED, "budget ran out before this trial"
            return row
        comp = stats.compare(_arm([ref_at[i] for i in rounds]), _arm([cand_at[i] for i in rounds]),
                             min_effect=self.opt.min_effect)
        base_loss = _mean_loss(self.results({}))
        row.loss_delta = stats.loss_delta(base_loss, _mean_loss(cand))
        row.verdict = stats.verdict(comp, row.loss_delta, tolerance=self.opt.loss_tolerance)
        row.speedup, row.ci, row.noise = comp.speedup, (comp.ci_low, comp.ci_high), comp.noise
        ref_mem, cand_mem = _max_mem(ref), _max_mem(cand)
        if ref_mem and cand_mem:
            row.memory_ratio = cand_mem / ref_mem
        if row.verdict == stats.LOSS_MISMATCH:
            row.note = (f"loss {_fmt(_mean_loss(cand))} vs baseline {_fmt(base_loss)} "
                        f"(tolerance {self.opt.loss_tolerance:.0%})")
        if len(rounds) < planned:
            row.note = (row.note + "; " if row.note else "") + f"{len(rounds)} of {planned} repeats (budget)"
        return row

    # ------------------------------------------------------------------ phases
    def run(self) -> TuneResult:
        self.say("baseline")
        base = self.trial({}, "baseline", 0)
        if base is None or not base.ok:
            raise TuneError("the baseline trial failed, so there is nothing to compare against: "
                            f"{base.error if base else 'no budget'}. Fix the config so "
                            "`trainspeed train` runs it, then tune again.")
        self.base_wall = base.wall_s
        ctx = KnobContext(config=self.base_config, device=self.device,
                          baseline_memory=base.memory_peak, block_classes=self.block_classes)
        candidates, skipped, deferred = self._candidates(ctx, base.wall_s)
        arms = [({}, "baseline")] + [(c.settings, f"{c.knob}={c.label}") for c in candidates]
        for r in range(self.opt.repeats if candidates else 0):  # nothing to compare: no more baselines
            self.say(f"ablation round {r + 1}/{self.opt.repeats}")
            self._round([(s, label, r) for s, label in arms], reverse=bool(r % 2))
        R = self.opt.repeats
        ablation = [self.row(c.knob, c.label, c.settings, {}, cost_factor=c.cost_factor,
                             ref_repeats=range(R), cand_repeats=range(R))
                    for c in candidates]
        ablation += [Row(knob=s.knob, setting=s.label, note=s.reason) for s in skipped]
        combination, best = self._greedy(ablation, deferred)
        final = self._verify(best) if best else None
        notes: list[str] = []
        if final is not None and final.verdict != stats.FASTER:
            notes.append(f"the combination verified as '{final.verdict}' against the baseline; "
                         "best.yaml keeps the baseline settings")
            best = {}
        if self._over_budget():  # not even one more baseline-sized trial fits
            notes.append(f"the budget ({self.opt.budget_s:.0f} s) ran out; rows marked 'skipped' "
                         "were not measured. Rerun with the same --out and a larger --budget to "
                         "continue from the finished trials")
        base_cost = stats.arm_cost(_arm([r for r in self.results({}) if r.ok]))
        return TuneResult(ablation=ablation, combination=combination, best_settings=best,
                          final=final, baseline_cost_s=base_cost, trials_run=self.run_count,
                          trials_reused=self.reused, elapsed_s=self.clock() - self.t0, notes=notes)

    def _candidates(self, ctx: KnobContext, base_wall: float) -> tuple[list[Candidate], list[Skip], list[str]]:
        """Knob settings that fit the budget, in knob priority order, and the rest with why."""
        candidates: list[Candidate] = []
        skipped: list[Skip] = []
        deferred: list[str] = []
        # Reserve room for the final verification (baseline + best, each verify_repeats times);
        # greedy steps use what the ablation leaves and stop at the budget like any trial.
        reserve = base_wall * 2 * self.opt.verify_repeats
        planned = base_wall * self.opt.repeats  # the baseline's own repeats
        for name in self.opt.knobs:
            for item in KNOBS[name](ctx):
                if isinstance(item, Skip):
                    skipped.append(item)
                    if item.deferred and name not in deferred:
                        deferred.append(name)
                    continue
                settings = item.settings
                self.cost_factor[config_key(self.base_hash, settings)] = item.cost_factor
                already = self.results(settings)
                cost = base_wall * item.cost_factor * max(0, self.opt.repeats - len(already))
                # A setting with finished trials (a resumed tune) is always reported.
                if not already and planned + cost + reserve > self.opt.budget_s:
                    skipped.append(Skip(name, item.label, f"does not fit the budget (~{cost:.0f} s "
                                        f"for {self.opt.repeats} repeats; raise --budget)"))
                    continue
                planned += cost
                candidates.append(item)
        return candidates, skipped, deferred

    def _compare_on_top(self, knob: str, label: str, current: dict[str, Any], new: dict[str, Any],
                        cost_factor: float) -> Row:
        """Measure `new` against `current` with fresh, interleaved repeats of both: R new
        repeats of `current` (numbers from next_repeat) and `new`'s 0..R-1; only those repeats
        of `current` are compared, since earlier ones ran at another time."""
        R = self.opt.repeats
        key = config_key(self.base_hash, current)
        self.cost_factor[config_key(self.base_hash, new)] = max(cost_factor, self.cost_factor.get(key, 1.0))
        start = self.next_repeat.get(key, R)
        self.next_repeat[key] = start + R
        for r in range(R):
            self._round([(current, "current", start + r), (new, f"+{knob}={label}", r)], reverse=bool(r % 2))
        return self.row(knob, label, new, current, cost_factor=cost_factor,
                        ref_repeats=range(start, start + R), cand_repeats=range(R))

    def _greedy(self, ablation: list[Row], deferred: list[str]) -> tuple[list[Row], dict[str, Any]]:
        winners: dict[str, Row] = {}
        for row in ablation:
            if row.verdict == stats.FASTER and (row.knob not in winners or
                                                (row.speedup or 0) > (winners[row.knob].speedup or 0)):
                winners[row.knob] = row
        ordered = sorted(winners.values(), key=lambda r: -(r.speedup or 0))
        combination: list[Row] = []
        current: dict[str, Any] = {}
        pending_deferred = list(deferred)
        if ordered:
            self.say("greedy combination")
        for row in ordered:
            clash = set(row.settings) & set(current)
            if clash:
                combination.append(Row(knob=row.knob, setting=row.setting, settings=row.settings,
                                       note=f"not combined: sets {', '.join(sorted(clash))}, "
                                            "already set by a bigger winner"))
                continue
            if not current:
                combination.append(row)  # measured against the baseline in the ablation
                current = dict(row.settings)
            else:
                new = {**current, **row.settings}
                step = self._compare_on_top(row.knob, row.setting, current, new, row.cost_factor)
                combination.append(step)
                if step.verdict == stats.FASTER:
                    current = new
            current, pending_deferred = self._try_deferred(current, pending_deferred, combination)
        before = current
        current = self._try_together(ablation + combination, winners, current, combination)
        if current is not before:  # the bundle may bring in a prerequisite (workers for prefetch)
            current, pending_deferred = self._try_deferred(current, pending_deferred, combination)
        return combination, current

    def _try_together(self, rows: list[Row], winners: dict[str, Row], current: dict[str, Any],
                      combination: list[Row]) -> dict[str, Any]:
        """Settings measured faster than their reference within their trials (confidence
        interval above 1) but not beyond the run-to-run noise (a 4 % gain on a machine whose
        repeats differ by 10 %), all at once on top of the winners: several such gains together
        can clear the noise that each alone cannot. One extra comparison, judged like every
        other, so a bundle of noise is not crowned."""
        hopefuls: dict[str, tuple[Row, dict[str, Any]]] = {}
        for row in rows:
            own = {k: v for k, v in row.settings.items() if current.get(k, _UNSET) != v}
            if (row.verdict == stats.NO_CHANGE and row.knob not in winners and own
                    and row.ci is not None and row.ci[0] > 1.0 and not set(own) & set(current)
                    and (row.knob not in hopefuls or (row.speedup or 0) > (hopefuls[row.knob][0].speedup or 0))):
                hopefuls[row.knob] = (row, own)
        bundle: dict[str, Any] = {}
        joined: list[Row] = []
        for row, own in hopefuls.values():
            if not set(own) & set(bundle):
                bundle.update(own)
                joined.append(row)
        if len(joined) < 2 and not (joined and current):
            return current  # a lone hopeful on the baseline was already measured as such
        label = ", ".join(f"{r.knob}={r.setting}" for r in joined)
        self.say(f"together: {label}")
        step = self._compare_on_top("together", label, current, {**current, **bundle},
                                    max(r.cost_factor for r in joined))
        combination.append(step)
        return {**current, **bundle} if step.verdict == stats.FASTER else current

    def _try_deferred(self, current: dict[str, Any], pending: list[str],
                      combination: list[Row]) -> tuple[dict[str, Any], list[str]]:
        """Knobs that needed another winner first (persistent_workers after num_workers)."""
        ctx = KnobContext(config=apply_settings(self.base_config, current), device=self.device,
                          block_classes=self.block_classes)
        still: list[str] = []
        for name in pending:
            items = KNOBS[name](ctx)
            cands = [i for i in items if isinstance(i, Candidate)]
            if not cands:
                still.append(name)
                continue
            best_row: Row | None = None
            for cand in cands:
                step = self._compare_on_top(name, cand.label, current, {**current, **cand.settings},
                                            cand.cost_factor)
                combination.append(step)
                if step.verdict == stats.FASTER and (best_row is None or (step.speedup or 0) > (best_row.speedup or 0)):
                    best_row = step
            if best_row is not None:
                current = dict(best_row.settings)
        return current, still

    def _verify(self, best: dict[str, Any]) -> Row:
        """Fresh interleaved repeats of the baseline and the best config, compared with each
        other only: the speedup the user gets from best.yaml."""
        self.say("verifying the combination against the baseline")
        R = self.opt.repeats
        V = self.opt.verify_repeats
        base_key, best_key = config_key(self.base_hash, {}), config_key(self.base_hash, best)
        n_base, n_best = self.next_repeat.get(base_key, R), self.next_repeat.get(best_key, R)
        if V and self.store.get(best_key, n_best) is None:
            # Not verified before. A resumed tune whose winners changed finds the baseline's
            # repeats at n_base.. already stored, run beside the old best: take the next ones.
            n_base = max(n_base, len(self.results({})))
        for v in range(V):
            self._round([({}, "baseline", n_base + v), (best, "best", n_best + v)], reverse=bool(v % 2))
        label = ", ".join(f"{k}={v}" for k, v in sorted(best.items()))
        return self.row("combined", label, best, {}, ref_repeats=range(n_base, n_base + V),
                        cand_repeats=range(n_best, n_best + V))


# ---------------------------------------------------------------------- helpers

_UNSET = object()


def _arm(results: list[TrialResult]) -> stats.Arm:
    per_epoch = next((r.steps_per_epoch for r in results if r.steps_per_epoch), None)
    return stats.Arm.of([r.step_times for r in results], [r.samples for r in results],
                        [r.epoch_starts for r in results], per_epoch)


def _mean_loss(results: list[TrialResult]) -> float | None:
    losses = [r.loss for r in results if r.ok and r.loss is not None]
    if not losses:
        return None
    if any(not math.isfinite(x) for x in losses):
        return math.inf
    return sum(losses) / len(losses)


def _max_mem(results: list[TrialResult]) -> float | None:
    mems = [r.memory_peak for r in results if r.memory_peak]
    return max(mems) if mems else None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"
