"""The search: every knob alone from the baseline (the ablation table), then the winners
combined greedily, then the combination verified against the baseline.

    result = Tuner(base_config=cfg_dict, device=DeviceInfo.detect(), runner=runner,
                   store=TrialStore(out), options=TuneOptions(knobs=["precision", ...])).run()

Trials are interleaved, the baseline between the candidates (B C1 C2 B C3 C4 B, odd rounds
reversed; order.py), so each candidate is compared with the two baseline trials around it. A
verdict must beat the noise: its rounds' spread, its brackets', the machine's pooled over the
tune (stats.compare; docs/tune.md says why each), and agree with its middle round.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Callable

from trainspeed.config_io import apply_overrides
from trainspeed.errors import TuneError  # noqa: F401  (imported from here by callers)
from trainspeed.tune import coupled, far_slower, parity, stats
from trainspeed.tune.admit import candidates_for
from trainspeed.tune.arms import arm_of, fill_samples, fmt_losses, max_memory
from trainspeed.tune.budget_plan import BaselineOutOfBudget
from trainspeed.tune.closing import tune_result
from trainspeed.tune.knob_types import steps_for_periods
from trainspeed.tune.leftover import measure_left
from trainspeed.tune.knobs import KNOBS, Candidate, DeviceInfo, KnobContext
from trainspeed.tune.load_proof import LoadProof, load_matched
from trainspeed.tune.one_time import note_one_time
from trainspeed.tune.options import TuneOptions
from trainspeed.tune.order import ablation_round, bracket_repeats, n_brackets
from trainspeed.tune.result import Row, TuneResult
from trainspeed.tune.short_run import ENDED_IN_WARMUP
from trainspeed.tune.spend import confirm, halve, offered, planned_trials, reprice, spend_rest
from trainspeed.tune.store import TrialStore
from trainspeed.tune.verify import final_answer
from trainspeed.tune.trials import SLOW_CUTOFF, Runner, TrialRequest, TrialResult, overrides_of

MIN_CUTOFF_S = 30.0
"""Never stop a trial before this: process start-up dominates a short baseline."""


def config_key(base_hash: str, settings: dict[str, Any]) -> str:
    blob = json.dumps([base_hash, sorted(settings.items())], default=str, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def apply_settings(config: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    return apply_overrides(config, list(overrides_of(settings)))


class Tuner(LoadProof):
    def __init__(self, *, base_config: dict[str, Any], base_hash: str, device: DeviceInfo,
                 runner: Runner, store: TrialStore, options: TuneOptions,
                 block_classes: list[str] | None = None, say: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.monotonic, knob_table: dict[str, Any] | None = None,
                 make_context: Callable[[dict[str, Any], TrialResult | None], Any] | None = None,
                 whatif: Callable[[dict[str, Any]], bool] | None = None, baseline_hint: str | None = None,
                 describe: Callable[[dict[str, Any]], str] | None = None,
                 trial_price: Callable[[TrialResult], float] | None = None,
                 fit_trials: Callable[[TrialResult, float], float] | None = None,
                 verify_as: Callable[[dict[str, Any]], dict[str, Any]] | None = None):
        self.base_config = base_config
        self.base_hash = base_hash
        self.device = device
        self.runner = runner
        self.store = store
        self.opt = options
        self.block_classes = block_classes or []
        self.say = say
        self.clock = clock
        # The knobs and what they look at: a config's (KNOBS, KnobContext) by default; the
        # script tuner passes its own (tune/script_knobs.py), read from the baseline's run.
        self.knobs = knob_table if knob_table is not None else KNOBS
        self.make_context = make_context or self._config_context
        # What-ifs measure what a finding costs (log every 10th call): reported, never combined
        # into best settings, since they change what the script does behind its back.
        self.is_whatif = whatif or (lambda settings: False)
        self.describe = describe or (lambda settings: ", ".join(f"{k}={v}" for k, v in sorted(settings.items())))
        # Expected wall seconds of the trials after the first baseline: the script tuner sets
        # the trial length from that baseline's step time, so its own wall is the wrong price.
        self.trial_price = trial_price or (lambda base: base.wall_s)
        # Sizes the trials to the budget (the script tuner: fewer steps): (first baseline, trials
        # the plan holds, in baseline units) -> the price of a trial.
        self.fit_trials = fit_trials or (lambda base, trials: self.trial_price(base))
        self.verify_as = verify_as or (lambda settings: settings)
        self.baseline_hint = baseline_hint or "Fix the config so `trainspeed train` runs it, then tune again."
        self.t0 = clock()
        self.spent = 0.0  # wall seconds of trials actually run (reused ones cost nothing)
        self.run_count = 0
        self.reused = 0
        self.base_wall = 0.0  # wall time of the first baseline trial: the price of a trial
        self.cost_factor: dict[str, float] = {}  # config key -> expected cost vs the baseline
        # (setting, value) -> one-time seconds before the first step (compiling): any config
        # holding it, a greedy combination or the verified best included, is allowed them.
        self.startup_s: dict[tuple[str, str], float] = {}
        # config key -> next unused repeat number: every on-top comparison runs fresh repeats of
        # its reference, interleaved with the candidate's (the ablation used 0..R-1). Assigned
        # in the search's own order, so a resumed tune finds the same numbers in its store.
        self.next_repeat: dict[str, int] = {}
        self.ran: set[tuple[str, int]] = set()  # (key, repeat) run or reused in this tune
        self.shapes: set[str] = set()  # trial shapes asked for: a stored one of another is not reused
        self.measure_steps: int | None = None  # a script trial's measured steps, once sized (admit.py)
        # Per comparison, its rounds' log speedups: together, the machine's noise per round.
        self.round_logs: dict[tuple, list[float]] = {}
        self.dropped: set[str] = set()  # config keys not repeated after an ablation round
        self.all_decided = False  # spend_rest stopped with nothing left to learn, not for the budget
        self.drop_why: dict[str, str] = {}  # and why (spend.halve)
        self.knob_of: dict[str, str] = {}  # setting key -> the knob that offered it (parity.math_free)
        self.knob_of_config: dict[str, str] = {}  # an ablation candidate's config key -> its knob
        self.knob_wall: dict[str, float] = {}  # knob -> the longest trial of its settings so far
        self.unadmitted: list[Candidate] = []  # settings the budget plan did not admit (spend.py)
        self.chosen_after: dict[str, int] = {}  # config key -> rounds before more were added for it
        self.asked_repeats: int | None = None  # --repeats, where a one-round plan lowered opt.repeats (admit.py)
        self.first_wall = 0.0  # wall seconds of the first baseline trial (admit.py)
        self.reserve_s = 0.0  # held back for the verification (the greedy steps once spent it)
        self.min_measure_steps = 0
        self.first_bracket = 0  # 1: the first baseline trial opens no round (run)
        self.retried: set[str] = set()  # settings whose earlier tune's crash this one ran again

    # ------------------------------------------------------------------ trials
    def key(self, settings: dict[str, Any]) -> str:
        return config_key(self.base_hash, settings)

    def _over_budget(self, key: str | None = None) -> bool:
        """True when the next trial (priced from the baseline's wall time) would end past the
        budget: a trial is never started that the budget cannot pay for."""
        return self.spent + self._price(key or "") + self.reserve_s > self.opt.budget_s

    def _price(self, key: str) -> float:
        """Expected wall seconds of one trial of `key`: the baseline's, times its cost factor, and
        at least the longest trial of its knob's other settings so far (starting 16 DataLoader
        workers costs more than the baseline's wall says, as 8 did)."""
        knob = self.knob_of_config.get(key)
        return max(self.base_wall * self.cost_factor.get(key, 1.0), self.knob_wall.get(knob, 0.0) if knob else 0.0)

    def _startup(self, settings: dict[str, Any]) -> float:
        return max((self.startup_s.get((k, repr(v)), 0.0) for k, v in settings.items()), default=0.0)

    def _one_verify_round(self) -> float:
        """One verification round (baseline + best), or nothing when it is off."""
        return 2 * self.base_wall if self.opt.verify_repeats else 0.0

    def _verify_reserve(self) -> float:
        """Budget the final verification needs: baseline + best, verify_repeats rounds each."""
        return self._one_verify_round() * self.opt.verify_repeats

    def _unpaid(self, trials: list[tuple[dict[str, Any], int]]) -> float:
        """Expected seconds of the trials (settings, repeat) not already in the store."""
        keys = [config_key(self.base_hash, settings) for settings, _ in trials]
        return sum(self._price(key) for key, (_, repeat) in zip(keys, trials)
                   if self.store.get(key, repeat) is None)

    def trial(self, settings: dict[str, Any], label: str, repeat: int) -> TrialResult | None:
        """Run (or reuse) one repeat of base+settings; None when the budget is spent."""
        key = config_key(self.base_hash, settings)
        self._note_shape()
        done = self.store.get(key, repeat)
        if done is not None and not self._same_shape(done):
            done = None  # measured at another length by an earlier tune into this --out: run afresh
        if done is not None and far_slower.budget_cut(done):
            done = None  # cut by an earlier tune's budget: "rerun with a larger --budget" measures it
        elif done is not None and settings and not far_slower.judged_now([done], self.ran, self.retried):
            self.retried.add(key)  # an earlier tune's crash: run once more (far_slower.judged_now)
            self.say(f"  {label}: its trial failed in an earlier tune into this --out; running it once more")
            done = None
        if done is not None:
            if (key, repeat) not in self.ran:
                self.ran.add((key, repeat))  # count each earlier trial once, not per lookup
                self.reused += 1
            return done
        if self._over_budget(key):
            return None
        cutoff = None
        # A far slower trial is stopped early; never a baseline trial: one far slower than the
        # first is the machine's load (word_language_model's, stopped at 30 s while others' jobs
        # took the cores), and losing it drops a round's pair.
        if self.base_wall and settings:
            price = far_slower.cutoff_price(self._price(key), self.results({}))
            cutoff = max(MIN_CUTOFF_S, SLOW_CUTOFF * price) + self._startup(settings)
        request = TrialRequest(key=key, label=label, overrides=overrides_of(settings), repeat=repeat,
                               timeout_s=cutoff, budget_s=max(1.0, self.opt.budget_s - self.spent))
        # its how-manieth trial in this tune (repeat numbers read out of order: baseline 1, 3, 5, 6, 4)
        self.say(f"  trial {label} (#{1 + sum(1 for k, _ in self.ran if k == key)}) ...")
        result = fill_samples(self.runner(request), settings, self.results({}))  # arms.py
        self.spent += result.wall_s
        self.run_count += 1
        knob = self.knob_of_config.get(key)
        if knob is not None:
            self.knob_wall[knob] = max(self.knob_wall.get(knob, 0.0), result.wall_s)
        self.store.add(result)
        self.ran.add((key, repeat))
        if result.ok:
            cost = stats.arm_cost(arm_of([result]))
            self.say(f"    {1e3 * cost:.3f} ms/sample, loss {fmt_losses(result)}, {result.wall_s:.1f} s")
        else:
            self.say(f"    failed: {(result.error or '').splitlines()[0] if result.error else ''}")
        return result

    def results(self, settings: dict[str, Any]) -> list[TrialResult]:
        """Every stored repeat of base+settings of a shape this tune runs, in repeat order.
        nanoGPT: a tune of other knobs into the same --out reused an earlier tune's trials of
        5+25 steps beside its own of 1+8, and a combination of three 1.01x settings read 1.32x."""
        return [r for r in self.store.of_key(config_key(self.base_hash, settings)) if self._same_shape(r)]

    def _note_shape(self) -> None:
        shape = getattr(self.runner, "shape", None)
        if shape is not None:
            self.shapes.add(shape)

    def _same_shape(self, result: TrialResult) -> bool:
        """Whether a stored trial ran as this tune's trials do (unknown on either side: yes)."""
        return result.shape is None or not self.shapes or result.shape in self.shapes

    def _round(self, arms: list[tuple[dict[str, Any], str, int]], reverse: bool) -> None:  # one interleaved round
        for settings, label, repeat in (list(reversed(arms)) if reverse else arms):
            earlier = far_slower.judged_now(self.results(settings), self.ran, self.retried)
            if not far_slower.may_run_again([r for r in earlier if r.repeat < repeat], self.results({}),
                                            reference=not settings):
                continue  # a setting that crashed once is not run again (nor one far slower)
            if config_key(self.base_hash, settings) in self.dropped:
                continue  # far slower in an earlier round
            self.trial(settings, label, repeat)

    # ------------------------------------------------------------------ comparison
    def row(self, knob: str, label: str, settings: dict[str, Any], reference: dict[str, Any],
            *, cost_factor: float = 1.0, pairs: list[tuple[tuple[int, ...], int]], proof: bool = True) -> Row:
        """Candidate vs reference on the repeats that ran next to each other: `pairs` holds,
        per round, the reference's repeats around the candidate's (pooled as one) and the
        candidate's repeat. A config's other repeats ran minutes away, in another phase of the
        search (a baseline's verification repeats, a winner's repeats as the reference of a
        later comparison), on another machine state; pooling them moved verdicts."""
        planned = len(pairs)
        row = Row(knob=knob, setting=label, settings=settings, cost_factor=cost_factor)
        rounds, failed = self._paired(settings, reference, pairs)
        if failed:
            error = failed[0].error or "failed"
            row.verdict = (stats.SLOWER if far_slower.stopped(failed[0]) else
                           stats.SKIPPED if far_slower.budget_cut(failed[0]) else stats.FAILED)
            row.note = error
            return row
        if not rounds:  # the budget's end, or stops before a plain trial's time (far_slower.py)
            row.verdict, row.note = stats.SKIPPED, far_slower.unmeasured_note(self.results(settings), pairs, self.results({}))
            return row
        ref = [r for refs, _ in rounds for r in refs]
        cand = [c for _, c in rounds]
        # This comparison's rounds join the machine's noise pool before it is judged by it.
        ref_arm, cand_arm = self._pool(knob, label, settings, reference, pairs, rounds)
        comp = stats.compare(ref_arm, cand_arm, min_effect=self.opt.min_effect,
                             round_sd=stats.pooled_round_sd(list(self.round_logs.values())),
                             bracket=stats.bracket_spread([stats.repeat_costs(arm_of(refs)) for refs, _ in rounds]))
        # Loss parity against the baseline trials as long as the candidate's, within the
        # spread of their own repeats, for each optimizer's own loss (parity.py).
        par = parity.judge_each(self.results({}), cand, self.opt.loss_tolerance, parity.math_free(settings, self.knob_of))
        row.loss_delta, row.loss_deltas = par.delta, par.deltas
        row.verdict = stats.verdict(comp, par.judged, tolerance=par.tolerance)
        row.speedup, row.ci, row.noise = comp.speedup, (comp.ci_low, comp.ci_high), comp.noise
        row.noise_from = comp.noise_from
        ref_mem, cand_mem = max_memory(ref), max_memory(cand)
        if ref_mem and cand_mem:
            row.memory_ratio = cand_mem / ref_mem
        if row.verdict == stats.LOSS_MISMATCH:
            row.note = par.note()
        elif par.near_zero_note():
            row.note = par.near_zero_note()
        if split := stats.split_rounds(row.verdict, ref_arm, cand_arm):  # the middle round says otherwise
            row.verdict, row.note = stats.NO_CHANGE, f"{row.note}; {split}" if row.note else split
        confirm(self, row, pairs)
        note_one_time(row, ref, cand)
        row.note = far_slower.rounds_note(row.note, len(rounds), planned, self.drop_why.get(self._key(settings), "budget"),
                                          [r for r in self.results(settings) if r.repeat in {c for _, c in pairs}])
        return self._load_proof(row, reference, pairs) if proof else row  # load_proof.py

    def _key(self, settings: dict[str, Any]) -> str:
        return config_key(self.base_hash, settings)

    def _paired(self, settings: dict[str, Any], reference: dict[str, Any], pairs: list[tuple[tuple[int, ...], int]]
                ) -> tuple[list[tuple[list[TrialResult], TrialResult]], list[TrialResult]]:
        """The rounds that ran (reference trials around the candidate's, the candidate's trial)
        and the candidate's failed trials. A round the budget cut short keeps the reference
        trials that ran, or drops out whole."""
        wanted = {rep for refs, _ in pairs for rep in refs}
        ref_by = {r.repeat: r for r in self.results(reference) if r.ok and r.repeat in wanted}
        cand_by = {r.repeat: r for r in self.results(settings) if r.repeat in {c for _, c in pairs}}
        rounds = [([ref_by[i] for i in refs if i in ref_by], cand_by[c]) for refs, c in pairs
                  if c in cand_by and cand_by[c].ok and any(i in ref_by for i in refs)]
        return rounds, far_slower.deciding([r for r in cand_by.values() if not r.ok], len(rounds), self.results({}))

    def _pool(self, knob: str, label: str, settings: dict[str, Any], reference: dict[str, Any],
              pairs: list[tuple[tuple[int, ...], int]], rounds: list[tuple[list[TrialResult], TrialResult]]
              ) -> tuple[stats.Arm, stats.Arm]:
        """The comparison's two arms; its rounds' log speedups go into the noise pool (keyed,
        so a comparison read twice counts once)."""
        ref_arm, cand_arm = arm_of([refs for refs, _ in rounds]), arm_of([[c] for _, c in rounds])
        key = (knob, label, config_key(self.base_hash, reference), config_key(self.base_hash, settings),
               tuple(c for _, c in pairs))
        quiet = load_matched(rounds, self.device.cores)  # the noise pool's rounds: load_proof.py
        if quiet:
            self.round_logs[key] = stats.round_log_ratios(arm_of([refs for refs, _ in quiet]),
                                                          arm_of([[c] for _, c in quiet]))
        return ref_arm, cand_arm

    # ------------------------------------------------------------------ phases
    def run(self) -> TuneResult:
        self.say("baseline")
        base = self.trial({}, "baseline", 0)
        if base is None or not base.ok:
            if base is not None and far_slower.budget_cut(base):
                raise BaselineOutOfBudget(base.wall_s)
            hint = "" if base is not None and base.error.startswith(ENDED_IN_WARMUP) else f" {self.baseline_hint}"
            raise TuneError("the baseline trial failed, so there is nothing to compare against: "
                            f"{base.error if base else 'no budget'}.{hint}")
        self.first_wall = base.wall_s
        ctx = self.make_context({}, base)
        offer = offered(self, ctx)
        self.min_measure_steps = steps_for_periods(offer)  # a script's fit_trials reads it
        self.base_wall = self.fit_trials(base, planned_trials(sum(c.cost_factor for c in offer), len(offer),
                                                              self.opt.repeats, self.opt.baseline_every,
                                                              self.opt.verify_repeats, reuse_first=base.shape is None))
        # A first trial of another length than the sized ones (a script's pricing trial) opens
        # no round: reinforce.py's 25 first episodes (0.90 ms/sample, 1.3 s) were the left
        # bracket of 300-episode trials (0.72 ms/sample, 51 s), and fused, run before any such
        # baseline, was stopped "far slower" at 30 s against a 7 s price.
        self.first_bracket = int(base.shape is not None and base.shape != getattr(self.runner, "shape", base.shape))
        self._note_shape()  # the sized trials' shape: a resumed tune's stored ones count from here
        if self.first_bracket:  # round 1's opening bracket now: its wall time prices what is admitted
            self._price_from_opening()
        candidates, skipped, deferred, one_round = candidates_for(self, ctx, self.base_wall)  # admit.py
        R, every = self.opt.repeats, self.opt.baseline_every
        # Every ablation round leaves the verification a round (halve, for the later ones): a
        # setting's trials can cost more than the plan's price (16 DataLoader workers, an H100).
        self.reserve_s = 0.0 if one_round else self._one_verify_round()
        for r in range(R if candidates else 0):  # nothing to compare: no more baselines
            self.say(f"ablation round {r + 1}/{R}")
            idle = frozenset(i for i, c in enumerate(candidates) if self.key(c.settings) in self.dropped
                             or not far_slower.may_run_again(far_slower.judged_now(
                                 self.results(c.settings), self.ran, self.retried), self.results({})))
            self._round(ablation_round(candidates, r, R, every, idle, self.first_bracket), reverse=False)
            halve(self, candidates, r)
        self.reserve_s = 0.0
        self.next_repeat[config_key(self.base_hash, {})] = self.first_bracket + R * n_brackets(len(candidates), every)
        pairs = [[(bracket_repeats(i, r, R, every, self.first_bracket), r) for r in range(R)]
                 for i in range(len(candidates))]
        late = {(c.knob, c.label) for c in spend_rest(self, candidates, pairs, self.unadmitted)}
        skipped = [s for s in skipped if (s.knob, s.label) not in late]
        # Every ablation comparison's rounds join the noise pool first, so the first row is
        # judged by the same machine noise as the last.
        for c, p in zip(candidates, pairs):
            self._pool(c.knob, c.label, c.settings, {}, p, self._paired(c.settings, {}, p)[0])
        ablation = [self.row(c.knob, c.label, c.settings, {}, cost_factor=c.cost_factor, pairs=p)
                    for c, p in zip(candidates, pairs)]
        ablation += [Row(knob=s.knob, setting=s.label, note=s.reason) for s in skipped]
        self.reserve_s = self._verify_reserve()  # the greedy steps leave the verification its trials
        combination, best = self._greedy(ablation, deferred)
        self.reserve_s = 0.0
        final, best = final_answer(self, best, ablation)
        final, best, leftover = measure_left(self, ablation, final, best)  # skipped, if a round fits now
        return tune_result(self, ablation, combination, final, best, leftover)  # closing.py

    def _price_from_opening(self) -> None:
        """Run round 1's opening baseline bracket before the settings are admitted,
        and price trials from what it took: the first trial's price is an extrapolation from
        fewer steps, and reinforce.py's lengthening episodes made a 7 s price of 51 s trials."""
        priced = self.base_wall
        opening = self.trial({}, "baseline", self.first_bracket)  # round 1's first bracket (order.py)
        if opening is None or not opening.ok:
            return
        reprice(self)
        if not 0.67 < self.base_wall / max(priced, 1e-9) < 1.5:
            self.say(f"a trial of the sized length took {self.base_wall:.0f} s, not the ~{priced:.0f} s the first "
                     "trial priced: settings are admitted at that price")

    def _config_context(self, settings: dict[str, Any], base: TrialResult | None) -> KnobContext:
        """A config tune's knobs see the base config with `settings` applied."""
        return KnobContext(config=apply_settings(self.base_config, settings) if settings else self.base_config,
                           device=self.device, baseline_memory=base.memory_peak if base else None,
                           block_classes=self.block_classes)

    def _compare_on_top(self, knob: str, label: str, current: dict[str, Any], new: dict[str, Any],
                        cost_factor: float) -> Row:
        """Measure `new` against `current` with fresh, interleaved repeats of both: R new
        repeats of `current` (numbers from next_repeat) and `new`'s 0..R-1; only those repeats
        of `current` are compared, since earlier ones ran at another time."""
        R = self.opt.repeats
        key = config_key(self.base_hash, current)
        self.cost_factor[config_key(self.base_hash, new)] = max(cost_factor, self.cost_factor.get(key, 1.0))
        start = self.next_repeat.get(key, R)
        self.next_repeat[key] = start + R  # assigned even when skipped: a resumed tune finds the same
        needed = self._unpaid([(current, start + r) for r in range(R)] + [(new, r) for r in range(R)])
        if needed and self.spent + needed + self.reserve_s > self.opt.budget_s:
            # Half a comparison cannot be judged: start none that the budget cannot finish.
            return Row(knob=knob, setting=label, settings=new, cost_factor=cost_factor,
                       note="does not fit the budget left before the verification")
        for r in range(R):
            self._round([(current, "current", start + r), (new, f"+{knob}={label}", r)], reverse=bool(r % 2))
        return self.row(knob, label, new, current, cost_factor=cost_factor,
                        pairs=[((start + r,), r) for r in range(R)])

    def _greedy(self, ablation: list[Row], deferred: list[str]) -> tuple[list[Row], dict[str, Any]]:
        # each knob's winners, fastest first (what-ifs are reported, never combined: __init__)
        ranked = coupled.winners_by_knob(ablation, self.is_whatif)
        winners = {rows[0].knob: rows[0] for rows in ranked}
        combination: list[Row] = []
        current: dict[str, Any] = {}
        pending_deferred = list(deferred)
        if ranked:
            self.say("greedy combination")
        for rows in ranked:
            # the knob's fastest winner that sets no key to another value than the winners so
            # far (num_workers=1 where "1 + 3 compute threads" clashes with threads=2): coupled.py
            row, passed = coupled.choose(rows, current)
            combination += passed
            if row is None:
                continue
            new = {**current, **row.settings}
            if not current:
                combination.append(row)  # measured against the baseline in the ablation
                current = dict(row.settings)
            elif new == current:
                combination.append(coupled.already_in(row))
            else:
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
            if (row.faster_inside_noise and row.knob not in winners and not self.is_whatif(row.settings) and own
                    and not set(own) & set(current)
                    and (row.knob not in hopefuls or (row.speedup or 0) > (hopefuls[row.knob][0].speedup or 0))):
                hopefuls[row.knob] = (row, own)
        bundle: dict[str, Any] = {}
        joined: list[Row] = []
        for row, own in sorted(hopefuls.values(), key=lambda item: -(item[0].speedup or 0)):
            if not set(own) & set(bundle) and self._offered(row, {**current, **bundle}):
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

    def _offered(self, row: Row, settings: dict[str, Any]) -> bool:
        """Whether the row's knob still offers its setting on top of `settings`: worker-only
        settings are moot once a bigger hopeful set num_workers=0 (the patch would drop them,
        and best.yaml would keep settings that do nothing)."""
        if row.knob not in self.knobs:
            return True
        items = self.knobs[row.knob](self.make_context(settings, None))
        return any(isinstance(item, Candidate) and all(row.settings.get(k, _UNSET) == v for k, v in item.settings.items())
                   for item in items)

    def _try_deferred(self, current: dict[str, Any], pending: list[str],
                      combination: list[Row]) -> tuple[dict[str, Any], list[str]]:
        """Knobs that needed another winner first (persistent_workers after num_workers)."""
        ctx = self.make_context(current, None)
        still: list[str] = []
        for name in pending:
            items = self.knobs[name](ctx)
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


# ---------------------------------------------------------------------- helpers

_UNSET = object()
