"""Advice that speaks to the script: findings name the script's own flag and its value, read
from a hand-built "script_flags" observation (argparse and nanoGPT --key=value shapes)."""
from __future__ import annotations

import pytest

from test_checks import LOADER0, ctx_of, make_run
from trainspeed.doctor.checks import data, hardware, no_step
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
    f = no_step.no_step_found(ctx_of(run))
    assert f.severity == "warning" and "50 training forwards, 50 backwards" in f.evidence
    assert "trainspeed.step()" in f.recommendation
    assert no_step.no_step_found(ctx_of(make_run(n=10, obs=[{"kind": "step_boundary", "forwards": 1}]))) is None


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


HF_TRAINING_ARGS = {"kind": "script_flags", "source": "argparse", "site": "run_clm.py:292", "flags": [
    # HfArgumentParser over TrainingArguments: a bool field is a `--x True/False` store flag plus,
    # for a True default, a `--no_x` storefalse flag with the same dest
    {"option": "--logging_nan_inf_filter", "dest": "logging_nan_inf_filter", "value": True, "default": True,
     "type": "string_to_bool", "kind": "store"},
    {"option": "--no_logging_nan_inf_filter", "dest": "logging_nan_inf_filter", "value": True, "default": False,
     "type": None, "kind": "storefalse"},
    {"option": "--dataloader_pin_memory", "dest": "dataloader_pin_memory", "value": True, "default": True,
     "type": "string_to_bool", "kind": "store"},
    {"option": "--no_dataloader_pin_memory", "dest": "dataloader_pin_memory", "value": True, "default": False,
     "type": None, "kind": "storefalse"},
]}


def test_trainer_script_findings_name_its_training_arguments_flags(tmp_path):
    # transformers' run_clm.py (Trainer, HfArgumentParser) under the doctor on a CPU: the pin_memory
    # and Trainer NaN-check findings said `pin_memory=False` and `TrainingArguments(...=False)`,
    # which a user of the unchanged script cannot type; its command line takes the flags.
    from test_checks import _sites
    from trainspeed.doctor.checks import syncs

    ctx = ctx_of(make_run(obs=[{**LOADER0, "pin_memory": True}, HF_TRAINING_ARGS]))
    f = data.pin_memory_without_cuda(ctx)
    assert f.recommendation.startswith("--dataloader_pin_memory False (the script's flag, now "
                                       "--dataloader_pin_memory True)")
    plain = data.pin_memory_without_cuda(ctx_of(make_run(obs=[{**LOADER0, "pin_memory": True}])))
    assert plain.recommendation.startswith("set pin_memory=False")

    lib = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "transformers"
    lib.mkdir(parents=True)
    (lib / "trainer.py").write_text("x = 1\nif (\n    self.args.logging_nan_inf_filter\n    and torch.isnan(loss)\n):\n")
    site = _sites("sync", "bool", 80, 0.001, site=f"{lib / 'trainer.py'}:2")
    f = syncs.host_syncs(ctx_of(make_run(obs=[site, HF_TRAINING_ARGS], syncs_per_step=2)))
    assert "pass --logging_nan_inf_filter False (the script's flag, now --logging_nan_inf_filter True:" \
        in f.recommendation
    # the verify command runs the fix as written, and with one call site all reads go
    assert f.verify_with.endswith("--logging_nan_inf_filter False (syncs per step should drop below 0.1)")
    f = syncs.host_syncs(ctx_of(make_run(obs=[site], syncs_per_step=2)))  # a script without the flags
    assert "set TrainingArguments(logging_nan_inf_filter=False) (the Trainer" in f.recommendation
    assert f.verify_with.endswith("(syncs per step should drop below 0.1)")


def test_host_sync_verify_expects_the_reads_the_fix_leaves(tmp_path):
    # run_clm.py: 2 reads a step in the Trainer's NaN check (its flag removes them) and 1 in
    # transformers' mask check (no flag): the verify said "should drop below 0.1"; run as
    # written with --logging_nan_inf_filter False the doctor read 1 per step.
    from trainspeed.doctor.checks import syncs

    lib = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "transformers"
    lib.mkdir(parents=True)
    (lib / "trainer.py").write_text("x = 1\nif (\n    self.args.logging_nan_inf_filter\n    and torch.isnan(loss)\n):\n")
    (lib / "masking_utils.py").write_text("if padding_mask is None or fast_all(padding_mask):\n    pass\n")
    rows = [{"category": "sync", "kind": "bool", "site": f"{lib / 'trainer.py'}:2", "code": "if (",
             "count": 80, "seconds": 0.001},
            {"category": "sync", "kind": "bool", "site": f"{lib / 'masking_utils.py'}:1", "code": "if", "count": 40,
             "seconds": 0.0005}]
    sites = {"kind": "call_sites", "rows": rows, "totals": {"sync": {"bool": {"count": 120, "seconds": 0.0015}}}}
    f = syncs.host_syncs(ctx_of(make_run(obs=[sites, HF_TRAINING_ARGS], syncs_per_step=3)))
    assert "--logging_nan_inf_filter False (syncs per step should drop from 3 to about 1: " in f.verify_with


def test_transformers_mask_check_is_named_with_what_removes_it(tmp_path):
    # run_clm_no_trainer.py (packed blocks, no padding): 4 reads a step at masking_utils.py:292,
    # `fast_all(padding_mask)` on the all-ones attention_mask, were told to "look for the
    # transformers option that reads a value every step"; there is none: no mask, no read
    from trainspeed.doctor.checks import syncs

    lib = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "transformers"
    lib.mkdir(parents=True)
    (lib / "masking_utils.py").write_text(
        "x = 1\nif (q_length == 1 or kv_length == q_length) and (padding_mask is None or fast_all(padding_mask)):\n")
    rows = [{"category": "sync", "kind": "bool", "site": f"{lib / 'masking_utils.py'}:2", "code": "if (",
             "count": 160, "seconds": 0.001}]
    sites = {"kind": "call_sites", "rows": rows, "totals": {"sync": {"bool": {"count": 160, "seconds": 0.001}}}}
    f = syncs.host_syncs(ctx_of(make_run(obs=[sites], syncs_per_step=4)))
    assert "set attention_mask=None when no token is padded" in f.recommendation, f.recommendation
    assert "`batch.pop(\"attention_mask\", None)` before `model(**batch)`" in f.recommendation
    assert "reads nothing without one" in f.recommendation and "look for the transformers option" not in f.recommendation


def test_set_flag_of_a_store_false_flag():
    from trainspeed.doctor.checks.script_flags import set_flag

    no_pin = {"option": "--no-pin-memory", "dest": "pin_memory", "value": True, "kind": "storefalse"}
    assert set_flag(no_pin, False) == "--no-pin-memory"
    assert set_flag(no_pin, True) == "(leave out --no-pin-memory)"


def test_the_verify_command_sets_the_fixed_flag_in_place():
    # pytorch/examples imagenet with --print-freq 1: the verify command read
    # `... --print-freq 1 ... --print-freq 50`, the old value left beside the fix.
    from test_checks import _sites
    from trainspeed.doctor.checks import syncs

    flags = {**NANOGPT, "flags": [{"option": "--log_interval", "dest": "log_interval", "value": 1,
                                   "default": None, "type": "int", "kind": "equals"}]}
    run = make_run(obs=[_sites("sync", "item", 40, 0.001), flags], syncs_per_step=1)
    run.config = {"command": ["python", "train.py", "--log_interval=1", "--batch_size=8"]}
    f = syncs.host_syncs(ctx_of(run))
    assert "-- python train.py --log_interval=50 --batch_size=8 (" in f.verify_with, f.verify_with
    assert "--log_interval=1" not in f.verify_with


def test_a_crash_before_the_first_step_is_the_finding_not_a_missing_step():
    """pytorch/examples dcgan/main.py without torchvision died at its import; the first finding
    read 'No training step was found ... (an inference-only script?)' and told the user to add
    trainspeed.step(). A crash before any step is the finding, with what gets past it."""
    boundary = {"kind": "step_boundary", "forwards": 0, "backwards": 0, "optimizer_steps": 0}
    crashed = {"kind": "doctor", "stopped": "crash", "exit_code": 1, "steps": 0,
               "error": "ModuleNotFoundError: No module named 'torchvision'"}
    f = no_step.no_step_found(ctx_of(make_run(n=0, obs=[boundary, crashed])))
    assert f.id == "crashed_before_training" and f.severity == "critical"
    assert "torchvision" in f.evidence and "python -m pip install torchvision" in f.recommendation
    assert "trainspeed.step()" not in f.recommendation
    cv = dict(crashed, error="ModuleNotFoundError: No module named 'cv2'")
    assert "pip install opencv-python" in no_step.no_step_found(ctx_of(make_run(n=0, obs=[boundary, cv]))).recommendation
    other = dict(crashed, error="RuntimeError: shapes cannot be multiplied")
    f = no_step.no_step_found(ctx_of(make_run(n=0, obs=[boundary, other])))
    assert f.id == "crashed_before_training" and "fix the error" in f.recommendation
    # a run that ended without a crash and without steps still gets the step advice; one that
    # exited itself before any training work is told so (tests/doctor/test_exit_before_training.py)
    ended = dict(crashed, stopped="end", exit_code=0, error=None)
    assert no_step.no_step_found(ctx_of(make_run(n=0, obs=[boundary, ended]))).id == "no_step_found"
    exited = dict(crashed, stopped="exit", error=None)
    assert no_step.no_step_found(ctx_of(make_run(n=0, obs=[boundary, exited]))).id == "exited_before_training"
