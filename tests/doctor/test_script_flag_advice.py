"""Advice that speaks to the script: findings name the script's own flag and its value, read
from a hand-built "script_flags" observation (argparse and nanoGPT --key=value shapes)."""
from __future__ import annotations

import pytest

from test_checks import LOADER0, ctx_of, make_run
from trainspeed.doctor.checks import data, hardware
from trainspeed.doctor.checks.script_flags import eval_interval, evaluation_advice, logging_advice, script_flag

pytestmark = pytest.mark.timeout(60)

ARGPARSE = {"kind": "script_flags", "source": "argparse", "site": "train.py:12", "flags": [
    {"option": "--workers", "dest": "workers", "value": 0, "default": 0, "type": "int", "kind": "store"},
    {"option": "--log-interval", "dest": "log_interval", "value": 1, "default": 200, "type": "int", "kind": "store"},
    {"option": "--compile", "dest": "compile", "value": False, "default": False, "type": None, "kind": "storetrue"},
]}
NANOGPT = {"kind": "script_flags", "source": "argv", "site": None, "flags": [
    {"option": "--eval_interval", "dest": "eval_interval", "value": 10, "default": None, "type": "int", "kind": "equals"},
    {"option": "--eval_iters", "dest": "eval_iters", "value": 200, "default": None, "type": "int", "kind": "equals"},
]}


def test_data_finding_names_the_workers_flag():
    f = data.data_bound(ctx_of(make_run(shares={"data": 0.5, "forward": 0.4}, obs=[LOADER0, ARGPARSE])))
    assert "--workers 7" in f.recommendation and "now --workers 0" in f.recommendation
    assert "the script's flag: --workers 0" in f.evidence


def test_data_finding_without_loader_or_with_one_core_never_says_even_with_workers():
    f = data.data_bound(ctx_of(make_run(shares={"data": 0.4, "forward": 0.4})))
    assert "no DataLoader" in f.evidence and "even with workers" not in f.recommendation
    one_core = {**LOADER0, "cores": 1}
    f = data.data_bound(ctx_of(make_run(shares={"data": 0.4, "forward": 0.4},
                                        obs=[one_core, {"kind": "device", "type": "cpu", "cores": 1}])))
    assert "single usable core" in f.recommendation and "even with workers" not in f.recommendation


def test_compile_and_logging_advice_use_the_flags():
    ctx = ctx_of(make_run(obs=[ARGPARSE, {"kind": "model", "class": "Net", "compiled": False}]))
    f = hardware.not_compiled(ctx)
    assert f.recommendation.startswith("--compile (the script's flag, now --compile (off))")
    assert "--log-interval 50" in logging_advice(ctx) and "now --log-interval 1" in logging_advice(ctx)
    assert script_flag(ctx, "eval_interval") is None


def test_evaluation_advice_states_the_measured_interval_and_flag():
    run = make_run(n=40, obs=[NANOGPT])
    for i, step in enumerate(run.steps):
        step["phases"]["eval"] = 0.02 if i % 10 == 0 else 0.0
    ctx = ctx_of(run)
    assert eval_interval(ctx) == 10
    evidence, recommendation = evaluation_advice(ctx)
    assert "every 10 steps" in evidence and "--eval_interval=10" in evidence and "--eval_iters=200" in evidence
    assert "--eval_interval=500" in recommendation and "--eval_iters=50" in recommendation
    assert "instead of every step" not in recommendation
    _, plain = evaluation_advice(ctx_of(make_run(n=40)))  # no flags, no measured interval
    assert "every 500 steps" in plain


def test_no_step_found_says_what_was_seen():
    run = make_run(n=0, obs=[{"kind": "step_boundary", "source": None, "forwards": 50, "backwards": 50,
                             "optimizer_steps": 0, "marks": 0}])
    f = hardware.no_step_found(ctx_of(run))
    assert f.severity == "warning" and "50 training forwards, 50 backwards" in f.evidence
    assert "trainspeed.step()" in f.recommendation
    assert hardware.no_step_found(ctx_of(make_run(n=10, obs=[{"kind": "step_boundary", "forwards": 1}]))) is None


def test_host_syncs_at_the_scripts_log_interval_name_that_flag():
    # karpathy/nanoGPT with its README's --log_interval=1: `lossf = loss.item()` inside
    # `if iter_num % log_interval == 0` read every step; the fix is the flag the user passed.
    from test_checks import _sites
    from trainspeed.doctor.checks import syncs

    flags = {**NANOGPT, "flags": [*NANOGPT["flags"], {"option": "--log_interval", "dest": "log_interval", "value": 1,
                                                      "default": None, "type": "int", "kind": "equals"}]}
    f = syncs.host_syncs(ctx_of(make_run(obs=[_sites("sync", "item", 40, 0.001), flags], syncs_per_step=1)))
    assert "once per the script's log interval (--log_interval=1): log less often, --log_interval=50" \
        in f.recommendation
    # reads every step with --log-interval 10 are not the logging's: the generic advice
    every_ten = {**ARGPARSE, "flags": [{**ARGPARSE["flags"][1], "value": 10}]}
    f = syncs.host_syncs(ctx_of(make_run(obs=[_sites("sync", "item", 40, 0.001), every_ten], syncs_per_step=1)))
    assert "log interval" not in f.recommendation and "keep the value on the device" in f.recommendation
    # one read every 10 steps under --log-interval 10 falls below the finding's rate (0.1 a step): no finding
    run = make_run(n=100, obs=[_sites("sync", "item", 10, 0.001), every_ten])
    assert syncs.host_syncs(ctx_of(run)) is None
