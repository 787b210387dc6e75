"""Loss parity over every optimizer's own loss (parity.judge_each), on the shapes real trials
record: a GAN trial's `loss` is the primary's (optimizerD), and `optimizer_losses` holds each
optimizer's own (telemetry/update_losses.py read by tune/optimizer_losses.py). Before, parity
compared only `loss`: a setting that broke the generator passed on the discriminator's."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from trainspeed.telemetry.rundir import RunData
from trainspeed.tune import parity, stats
from trainspeed.tune.optimizer_losses import read_optimizer_losses
from trainspeed.tune.trials import TrialResult

FLOOR = 0.05


def gan_trial(repeat: int, d: float, g: float, *, key: str = "k", d_start: float = 1.39, g_start: float = 0.55,
              steps: int = 31) -> TrialResult:
    """A trial as result_from_run_dir reads a two-optimizer script's run (the figures of the
    tests/assets/scripts/gan_fragile_generator.py tune in test_gan_parity.py)."""
    return TrialResult(key=key, label="x", repeat=repeat, ok=True, step_times=[0.01] * 30, samples=[64.0] * 30,
                       loss=d, loss_start=d_start, steps_run=steps, loss_optimizer="optimizerD",
                       optimizer_losses={"optimizerD": d, "optimizerG": g},
                       optimizer_loss_starts={"optimizerD": d_start, "optimizerG": g_start})


def plain_trial(repeat: int, loss: float, start: float = 2.3) -> TrialResult:
    return TrialResult(key="k", label="x", repeat=repeat, ok=True, loss=loss, loss_start=start, steps_run=31)


BASELINE = [gan_trial(i, 0.1941, 0.1528) for i in range(3)]


def test_a_setting_that_breaks_only_the_second_optimizers_loss_fails_on_it_named():
    cand = [gan_trial(0, 0.1940, 0.4614), gan_trial(1, 0.1940, 0.4614)]
    assert not parity.judge(BASELINE, cand, FLOOR).failed  # the primary alone passes it (the old check)
    par = parity.judge_each(BASELINE, cand, FLOOR)
    assert [p.optimizer for p in par.failing] == ["optimizerG"]
    assert par.delta == pytest.approx(0.4614 / 0.1528 - 1)  # the table's loss delta: G's
    assert par.deltas == pytest.approx({"optimizerD": 0.1940 / 0.1941 - 1, "optimizerG": 0.4614 / 0.1528 - 1})
    assert not stats.loss_ok(par.judged, par.tolerance)  # the verdict: loss mismatch, whatever the speed
    assert par.note() == ("optimizerG's loss 0.4614 vs baseline 0.1528: beyond a tolerance of 5.0% "
                          "(the floor; the baseline's repeats spread 0.0%)")


def test_the_primary_failing_is_named_too_and_every_failing_loss_is_in_the_note():
    cand = [gan_trial(0, 0.30, 0.4614)]
    par = parity.judge_each(BASELINE, cand, FLOOR)
    assert [p.optimizer for p in par.failing] == ["optimizerD", "optimizerG"]
    assert par.note().startswith("optimizerD's loss 0.3 vs baseline 0.1941") and "; optimizerG's loss 0.4614" in par.note()
    assert par.delta == pytest.approx(0.30 / 0.1941 - 1)  # the first failing: the primary's


def test_each_loss_is_judged_by_the_baselines_own_spread_of_it():
    # G's baseline repeats spread 20 % by themselves (a GAN's generator is noisy); D's agree
    noisy = [gan_trial(0, 0.1941, 0.50), gan_trial(1, 0.1941, 0.60), gan_trial(2, 0.1941, 0.55)]
    par = parity.judge_each(noisy, [gan_trial(0, 0.1941, 0.60)], FLOOR)
    g = par.others[0]
    assert g.optimizer == "optimizerG" and g.tolerance == pytest.approx(0.10 / 0.55) and not g.failed
    assert par.primary.tolerance == FLOOR and not par.failing
    assert parity.judge_each(noisy, [gan_trial(0, 0.1941, 0.70)], FLOOR).failing[0].optimizer == "optimizerG"


def test_near_zero_and_math_free_apply_to_each_loss_on_its_own_scale():
    # both generators converged near zero against a start of 0.55: apart by under 1 % of that
    base = [gan_trial(i, 0.1941, 0.001) for i in range(2)]
    par = parity.judge_each(base, [gan_trial(0, 0.1941, 0.004)], FLOOR)
    assert not par.failing and par.near_zero_note().startswith("optimizerG's loss 0.004 vs baseline 0.001: both near zero")
    # a math-free setting (workers) is never refused for loss, unless a loss is not finite
    assert not parity.judge_each(BASELINE, [gan_trial(0, 0.1941, 0.4614)], FLOOR, free=True).failing
    diverged = parity.judge_each(BASELINE, [gan_trial(0, 0.1941, math.inf)], FLOOR, free=True)
    assert [p.optimizer for p in diverged.failing] == ["optimizerG"] and math.isinf(diverged.delta)


def test_one_optimizer_is_judged_exactly_as_before():
    base, cand = [plain_trial(0, 1.0), plain_trial(1, 1.02)], [plain_trial(0, 1.2)]
    each, alone = parity.judge_each(base, cand, FLOOR), parity.judge(base, cand, FLOOR)
    assert each.others == () and each.primary == alone and each.primary.optimizer is None and each.deltas == {}
    assert (each.delta, each.judged, each.tolerance, each.note()) == (alone.delta, alone.judged, alone.tolerance,
                                                                     alone.note())
    assert each.note().startswith("loss 1.2 vs baseline 1.01: beyond")  # no name: as it always read


def test_trials_stored_before_each_loss_was_recorded_read_as_one_optimizer():
    stored = TrialResult.from_json({"key": "k", "label": "x", "repeat": 0, "ok": True, "loss": 0.5, "steps_run": 31})
    assert stored.optimizer_losses == {} and stored.loss_optimizer is None
    assert parity.judge_each([stored], [plain_trial(0, 0.5)], FLOOR).others == ()
    back = TrialResult.from_json(gan_trial(0, 0.19, 0.15).to_json())  # the store keeps them
    assert back.optimizer_losses == {"optimizerD": 0.19, "optimizerG": 0.15} and back.loss_optimizer == "optimizerD"


def run_of(g_values: list[float | None], nonfinite_at: int | None = None) -> RunData:
    """A two-optimizer run as the doctor writes it: step records and update_losses events."""
    n = len(g_values)
    run = RunData(path=Path("trial"))
    run.steps = [{"step": s, "t_step": 0.01, "loss": 1.0 - 0.01 * s} for s in range(n)]
    half = n // 2
    run.events = [{"type": "update_losses", "step": first + len(part) - 1,
                   "data": {"first_step": first, "column": "optimizerD",
                            "losses": {"optimizerD": [1.0 - 0.01 * s for s in range(first, first + len(part))],
                                       "optimizerG": part},
                            "nonfinite": {"optimizerG": 1} if nonfinite_at is not None
                            and first <= nonfinite_at < first + len(part) else {}}}
                  for first, part in ((0, g_values[:half]), (half, g_values[half:]))]
    return run


def test_each_optimizers_figures_are_read_from_the_run_as_the_primarys_are():
    g = [2.0, 1.9, 1.8, 1.7, 1.6, 1.5, 1.4, 1.3, 1.2, 1.1, 1.0, 0.9, 0.8, 0.7, 0.6, None]  # G's last update not made
    own = read_optimizer_losses(run_of(g))
    assert own.primary == "optimizerD" and list(own.end) == ["optimizerD", "optimizerG"]
    assert own.end["optimizerG"] == pytest.approx(np.mean([0.8, 0.7, 0.6]))  # the last quarter's, made updates
    assert own.start["optimizerG"] == pytest.approx(np.mean(g[:5]))
    assert own.end["optimizerD"] == pytest.approx(np.mean([1.0 - 0.01 * s for s in range(12, 16)]))
    # a NaN loss of G in the interval that holds the tail (recorded null, counted): inf, refused
    broken = g[:13] + [None, None, None]
    assert math.isinf(read_optimizer_losses(run_of(broken, nonfinite_at=13)).end["optimizerG"])
    # earlier, in an interval the tail does not reach: the tail's own figure
    assert math.isfinite(read_optimizer_losses(run_of(g[:2] + [None] + g[3:], nonfinite_at=2)).end["optimizerG"])
    # one optimizer: nothing
    one = run_of(g)
    one.events = []
    assert read_optimizer_losses(one).end == {}


def test_a_seeded_gans_trajectory_noise_is_no_mismatch_but_a_broken_generator_still_is():
    # pytorch/examples' dcgan --manualSeed 1 (FakeData, 63 iterations): the baseline's repeats
    # agree exactly (spread 0: the 5 % floor alone), and bf16's generator loss read 3.138 against
    # 2.902 (+8 %) while each tail's per-step losses gave a standard error of ~4.7 % of its mean.
    # It was refused as a loss mismatch; it is the trajectory's noise, not a worse generator.
    def dcgan(repeat: int, d: float, g: float, d_se: float, g_se: float) -> TrialResult:
        t = gan_trial(repeat, d, g, d_start=1.6, g_start=4.0)
        t.loss_scatter, t.optimizer_loss_scatters = d_se, {"optimizerD": d_se, "optimizerG": g_se}
        return t

    base = [dcgan(i, 1.1051, 2.9017, 0.056, 0.0466) for i in range(1, 4)]
    bf16 = [dcgan(i, 0.9930, 3.1379, 0.0434, 0.0484) for i in range(2)]
    par = parity.judge_each(base, bf16, FLOOR)
    assert not par.failing, par.note()
    g = par.others[0]
    assert g.optimizer == "optimizerG" and g.spread == 0.0
    assert g.scatter == pytest.approx(parity.SCATTER_Z * math.hypot(0.0466, 0.0484))
    assert g.tolerance == g.scatter and g.delta == pytest.approx(3.1379 / 2.9017 - 1)
    # a generator that really got worse still fails, and the note says what set the bar
    broken = [dcgan(i, 0.9930, 4.4, 0.0434, 0.0484) for i in range(2)]
    par = parity.judge_each(base, broken, FLOOR)
    assert [p.optimizer for p in par.failing] == ["optimizerG"]
    assert "3 standard errors of the per-step losses the two sides averaged" in par.note()
    # without a scatter on either side (a validation loss, a short tail): the floor, as before
    for t in bf16:
        t.optimizer_loss_scatters = {}
    assert [p.optimizer for p in parity.judge_each(base, bf16, FLOOR).failing] == ["optimizerG"]


def test_tail_scatter_is_the_relative_standard_error_of_the_tail_mean():
    from trainspeed.tune.optimizer_losses import tail_scatter

    tail = np.array([2.0, 4.0, 2.0, 4.0, np.nan])
    assert tail_scatter(tail) == pytest.approx(np.std([2, 4, 2, 4], ddof=1) / 2 / 3)
    assert tail_scatter(np.array([1.0, 2.0, np.inf])) is None  # too few finite losses
