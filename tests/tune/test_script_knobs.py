"""The script tuner's pure parts: knobs from what the doctor saw, flags on a command line,
the settings file, telling a command from a config."""

from __future__ import annotations

import pytest

from trainspeed.errors import ConfigError
from trainspeed.patches.plan import Plan, apply_flags, load_plan, save_plan
from trainspeed.patches.targets import Targets
from trainspeed.tune.knobs import Candidate, DeviceInfo, Skip
from trainspeed.tune.script_facts import ScriptFacts
from trainspeed.tune.script_session import flag_styles
from trainspeed.tune.knob_types import steps_for_periods
from trainspeed.tune.script_knobs import (SCRIPT_KNOBS, ScriptContext, knobs_from_findings,
                                          parse_script_knobs)

pytestmark = pytest.mark.timeout(60)

WORKERS_FLAG = {"option": "--workers", "dest": "workers", "value": 0, "default": 0, "type": "int", "kind": "store"}


def ctx(**kw) -> ScriptContext:
    facts = ScriptFacts(targets=kw.pop("targets", Targets(model_class="Net")),
                        loader=kw.pop("loader", {"num_workers": 0}), model=kw.pop("model", {"class": "Net"}),
                        optimizer=kw.pop("optimizer", {"class": "AdamW", "fused": None}),
                        flags=kw.pop("flags", []), steps=kw.pop("steps", 30), log_calls=kw.pop("log_calls", 0),
                        save_calls=kw.pop("save_calls", 0))
    kind = kw.pop("device", "cpu")
    device = DeviceInfo(type=kind, cores=kw.pop("cores", 2), has_compiler=True,
                        cuda_capability=(8, 0) if kind == "cuda" else None)
    return ScriptContext(facts=facts, device=device, settings=kw.pop("settings", {}))


def settings(items) -> list[dict]:
    return [c.settings for c in items if isinstance(c, Candidate)]


def test_num_workers_patches_the_loader_or_passes_the_scripts_own_flag():
    assert settings(SCRIPT_KNOBS["num_workers"](ctx())) == [
        {"loader.num_workers": 1}, {"loader.num_workers": 2}, {"loader.num_workers": 1, "threads": 1}]
    with_flag = settings(SCRIPT_KNOBS["num_workers"](ctx(flags=[WORKERS_FLAG])))
    assert with_flag[0] == {"args.--workers": 1}
    # a --workers flag whose value is not the loader's (it feeds another loader) is not trusted
    other = dict(WORKERS_FLAG, value=4)
    assert settings(SCRIPT_KNOBS["num_workers"](ctx(flags=[other])))[0] == {"loader.num_workers": 1}
    no_loader = SCRIPT_KNOBS["num_workers"](ctx(loader=None))
    assert isinstance(no_loader[0], Skip) and "no DataLoader" in no_loader[0].reason


def test_worker_dependent_knobs_wait_for_workers():
    [skip] = SCRIPT_KNOBS["persistent_workers"](ctx())
    assert isinstance(skip, Skip) and skip.deferred
    after = SCRIPT_KNOBS["persistent_workers"](ctx(settings={"loader.num_workers": 2}))
    assert settings(after) == [{"loader.persistent_workers": True}]
    flagged = SCRIPT_KNOBS["prefetch_factor"](ctx(flags=[WORKERS_FLAG], settings={"args.--workers": 1}))
    assert settings(flagged) == [{"loader.prefetch_factor": 4}, {"loader.prefetch_factor": 8}]


def test_precision_and_compile_respect_what_the_script_already_does():
    [skip] = SCRIPT_KNOBS["precision"](ctx(targets=Targets(autocast="bfloat16")))
    assert isinstance(skip, Skip) and "already autocasts" in skip.reason
    cpu = SCRIPT_KNOBS["precision"](ctx())
    assert settings(cpu) == [{"precision": "bf16"}] and "fp16" in [s.label for s in cpu if isinstance(s, Skip)]
    gpu = SCRIPT_KNOBS["precision"](ctx(device="cuda"))
    assert settings(gpu) == [{"precision": "bf16"}, {"precision": "fp16"}]
    assert isinstance(SCRIPT_KNOBS["compile"](ctx(targets=Targets(compiled=True)))[0], Skip)
    nano = {"option": "--compile", "dest": "compile", "value": False, "type": "bool", "kind": "equals"}
    [c] = SCRIPT_KNOBS["compile"](ctx(flags=[nano]))
    assert c.settings == {"args.--compile": True} and c.cost_factor == 3.0 and c.label == "--compile=True"
    hf = {"option": "--torch_compile", "dest": "torch_compile", "value": False, "type": "string_to_bool",
          "kind": "store"}
    [c] = SCRIPT_KNOBS["compile"](ctx(flags=[hf]))
    assert c.settings["args.--torch_compile"] is True  # run_clm.py's flag: True, not 1 (1 == True)


def test_compile_on_cuda_also_tries_cuda_graphs():
    """A launch-bound loop needs its kernels replayed as CUDA graphs: on an H100 'default'
    alone gave launch_bound.py 1.19-1.40x. On a CPU reduce-overhead is 'default' again."""
    assert settings(SCRIPT_KNOBS["compile"](ctx(device="cuda"))) == [{"compile": "default"},
                                                                     {"compile": "reduce-overhead"}]
    assert settings(SCRIPT_KNOBS["compile"](ctx())) == [{"compile": "default"}]


def test_what_ifs_only_where_the_doctor_saw_the_calls():
    assert isinstance(SCRIPT_KNOBS["log_every"](ctx(log_calls=3, steps=30))[0], Skip)
    assert settings(SCRIPT_KNOBS["log_every"](ctx(log_calls=60, steps=30))) == [{"whatif.log_every": 10}]
    # every 10th of 2 calls a step: one call every 5 steps; of 1 call every 2 steps: every 20
    assert [c.period_steps for c in SCRIPT_KNOBS["log_every"](ctx(log_calls=60, steps=30))] == [5]
    assert [c.period_steps for c in SCRIPT_KNOBS["log_every"](ctx(log_calls=15, steps=30))] == [20]
    assert steps_for_periods([*SCRIPT_KNOBS["log_every"](ctx(log_calls=15, steps=30)), *SCRIPT_KNOBS["compile"](ctx())]) == 60
    assert settings(SCRIPT_KNOBS["checkpoint_every"](ctx(save_calls=6))) == [{"whatif.save_every": 4}]
    assert isinstance(SCRIPT_KNOBS["channels_last"](ctx())[0], Skip)
    assert settings(SCRIPT_KNOBS["channels_last"](ctx(targets=Targets(convolutional=True)))) == [{"channels_last": True}]


def test_knob_names_and_findings_order():
    with pytest.raises(ConfigError, match="did you mean 'num_workers'"):
        parse_script_knobs("num_worker")
    findings = [{"verify_with": "trainspeed tune --knobs num_workers -- python train.py"},
                {"verify_with": "trainspeed tune --knobs log_every,precision -- python train.py"},
                {"verify_with": None}]
    assert knobs_from_findings(findings) == ["num_workers", "log_every", "precision"]


def test_an_eval_or_save_interval_stays_inside_the_scripts_own_run():
    """nanoGPT at --max_iters=60 --eval_interval=30: x4 (120) left the run one evaluation, at
    iteration 0, and no checkpoint; x2 keeps the last. Its trials must hold one interval."""
    evals = {"option": "--eval_interval", "dest": "eval_interval", "value": 30, "type": "int", "kind": "equals"}
    iters = {"option": "--max_iters", "dest": "max_iters", "value": 60, "type": "int", "kind": "equals"}
    [c] = SCRIPT_KNOBS["eval_every"](ctx(flags=[evals, iters]))
    assert (c.label, c.min_steps, c.period_steps) == ("--eval_interval=60", 30, 0)
    [c] = SCRIPT_KNOBS["eval_every"](ctx(flags=[evals]))  # no run length known: x4
    assert c.label == "--eval_interval=120"
    [skip] = SCRIPT_KNOBS["eval_every"](ctx(flags=[evals, {**iters, "value": 50}]))
    assert isinstance(skip, Skip) and skip.label == "--eval_interval=60"  # the table read "1x"
    assert skip.reason == (
        "at --max_iters=50, --eval_interval=60 would leave the run none of this work after its first step "
        "(no evaluation or checkpoint the script makes at that interval)")
    epochs = {"option": "--epochs", "dest": "epochs", "value": 2, "type": "int", "kind": "store"}
    [c] = SCRIPT_KNOBS["eval_every"](ctx(flags=[evals, epochs]))  # epochs are not steps
    assert c.label == "--eval_interval=120"


def test_interval_flags_are_labelled_as_the_script_takes_them():
    # nanoGPT's configurator reads --log_interval=10 only ("--log_interval 10" is a config file
    # named --log_interval to it): the table's label is what the user would type
    nano = {"option": "--log_interval", "dest": "log_interval", "value": 1, "type": "int", "kind": "equals"}
    [c] = SCRIPT_KNOBS["log_every"](ctx(flags=[nano]))
    assert (c.label, c.settings) == ("--log_interval=10", {"args.--log_interval": 10})
    assert c.period_steps == 10  # a trial measures 3 of its reads (knob_types.PERIODS_PER_TRIAL)
    # word_language_model's --log-interval 20: trials measuring fewer than 20 steps hold no log on
    # either side (tune/admit.py then skips it, as test_search's eval interval)
    wlm = {"option": "--log-interval", "dest": "log_interval", "value": 20, "type": "int", "kind": "store"}
    [c] = SCRIPT_KNOBS["log_every"](ctx(flags=[wlm]))
    assert (c.label, c.min_steps, c.period_steps) == ("--log-interval 200", 20, 200)
    spaced = {"option": "--save-every", "dest": "save_every", "value": 5, "type": "int", "kind": "store"}
    [c] = SCRIPT_KNOBS["checkpoint_every"](ctx(flags=[spaced], save_calls=6))
    assert (c.label, c.settings) == ("--save-every 20", {"args.--save-every": 20}) and c.period_steps == 0
    # the verified combination's label too: llama2.c's "combined --compile True" (its trials ran
    # --compile=True, but the label did not, and "--compile True" crashes its configurator)
    from trainspeed.tune.script_session import describe_settings

    settings = {"args.--compile": True, "args.--amp": True, "args.--workers": 4, "loader.pin_memory": True}
    styles = {"--compile": "equals", "--amp": "bare"}
    assert describe_settings(settings, styles) == "--amp, --compile=True, --workers 4, loader.pin_memory=True"
    assert describe_settings({"args.--amp": False}, styles) == "--amp off"


def test_apply_flags_replaces_in_place_or_appends():
    cmd = ["python", "train.py", "--workers", "0", "--lr=3e-4"]
    assert apply_flags(cmd, {"--workers": 4}) == ["python", "train.py", "--workers", "4", "--lr=3e-4"]
    assert apply_flags(cmd, {"--lr": 0.1}) == ["python", "train.py", "--workers", "0", "--lr=0.1"]
    assert apply_flags(["python", "t.py"], {"--compile": True}, {"--compile": "equals"}) == \
        ["python", "t.py", "--compile=True"]
    assert apply_flags(["python", "t.py"], {"--amp": True}, {"--amp": "bare"}) == ["python", "t.py", "--amp"]
    assert apply_flags(["python", "t.py", "--amp", "x"], {"--amp": False}, {"--amp": "bare"}) == \
        ["python", "t.py", "x"]


def test_settings_file_round_trip_and_clear_errors(tmp_path):
    plan = Plan(command=["python", "train.py"], settings={"args.--workers": 2},
                targets=Targets(loader_site=("/x/train.py", 3)), flag_styles={"--workers": "space"})
    save_plan(plan, tmp_path / "best.yaml", header="# a header")
    back = load_plan(tmp_path / "best.yaml")
    assert back.flags() == {"--workers": 2} and back.targets.loader_site == ("/x/train.py", 3)
    with pytest.raises(ConfigError, match="no such file"):
        load_plan(tmp_path / "missing.yaml")
    (tmp_path / "cfg.yaml").write_text("recipe: {name: gpt}\n")
    with pytest.raises(ConfigError, match="not a script settings file"):
        load_plan(tmp_path / "cfg.yaml")


def test_tune_cli_tells_a_command_from_a_config():
    from trainspeed.cli.tune import is_script_command

    assert is_script_command("python") and is_script_command("python3.11") and is_script_command("train.py")
    assert not is_script_command("gpt") and not is_script_command("my.yaml") and not is_script_command(None)


def test_from_run_orders_the_knobs_its_findings_name_first():
    from trainspeed.tune.script_session import order_knobs

    facts = ScriptFacts(targets=Targets(), findings=[
        {"verify_with": "trainspeed tune --knobs log_every -- python train.py"},
        {"verify_with": "trainspeed tune --knobs compile -- python train.py"}])
    assert order_knobs(["num_workers", "compile", "threads", "log_every"], facts) == \
        ["log_every", "compile", "num_workers", "threads"]
    assert order_knobs(["num_workers", "threads"], None) == ["num_workers", "threads"]


def test_a_trial_whose_setting_failed_at_run_time_is_a_failed_trial(tmp_path, monkeypatch):
    """A compile that fell back to eager measured eager code: not the compiled speed."""
    import json

    from trainspeed.tune.script_trials import ScriptRunner
    from trainspeed.tune.trials import SubprocessRunner, TrialRequest, TrialResult

    run_dir = tmp_path / "trials" / "k-r0"
    run_dir.mkdir(parents=True)
    (run_dir / "patches.json").write_text(json.dumps({"notes": [
        "compile: Net compiled in place (mode default)", "failed: torch.compile fell back to eager: boom"]}))
    monkeypatch.setattr(SubprocessRunner, "__call__", lambda self, request: TrialResult(
        key=request.key, label=request.label, repeat=0, ok=True, step_times=[0.1] * 3, samples=[1] * 3,
        run_dir=str(run_dir)))
    runner = ScriptRunner(base_config=tmp_path / "x.yaml", out_dir=tmp_path / "trials", command=["python", "t.py"])
    result = runner(TrialRequest(key="k", label="compile=default", overrides=("compile=default",), repeat=0))
    assert not result.ok and result.error.startswith("failed: torch.compile fell back")
    args = runner.arguments(TrialRequest(key="k", label="x", overrides=("args.--workers=4", "threads=1"), repeat=0))
    plan = load_plan(args[args.index("--with") + 1])
    assert plan.settings == {"args.--workers": 4, "threads": 1} and args[-2:] == ["python", "t.py"]
    assert args[args.index("--steps") + 1] == "30"  # 5 warm-up + 25 measured
    assert "--no-flops" in args  # a trial compares step times; counting FLOPs would cost one of its steps
    runner.count_flops = True  # the first baseline trial of a tune without --from: the baseline's MFU
    assert "--no-flops" not in runner.arguments(TrialRequest(key="k", label="baseline", overrides=(), repeat=0))


def test_precision_goes_through_a_trainer_scripts_bf16_flag():
    # transformers' run_clm.py: the model call is inside transformers' trainer.py, so an autocast
    # patch there could come back only as "outside your project"; its --bf16 flag is the fix.
    hf = {"option": "--bf16", "dest": "bf16", "value": False, "default": False, "type": "string_to_bool",
          "kind": "store"}
    assert settings(SCRIPT_KNOBS["precision"](ctx(flags=[hf]))) == [{"args.--bf16": True}]
    switch = {"option": "--bf16", "dest": "bf16", "value": False, "type": None, "kind": "storetrue"}
    assert settings(SCRIPT_KNOBS["precision"](ctx(flags=[switch]))) == [{"args.--bf16": True}]
    # a Trainer on a CPU: TrainingArguments refuses bf16 without --use_cpu where no bf16 GPU is
    use_cpu = {"option": "--use_cpu", "dest": "use_cpu", "value": False, "type": "string_to_bool", "kind": "store"}
    assert settings(SCRIPT_KNOBS["precision"](ctx(flags=[hf, use_cpu]))) == [
        {"args.--bf16": True, "args.--use_cpu": True}]
    assert settings(SCRIPT_KNOBS["precision"](ctx(flags=[hf, use_cpu], device="cuda")))[0] == {"args.--bf16": True}
    # a --bf16 that is not an off switch (a dtype name, already on) is left alone
    for other in ({**hf, "type": "str", "value": "no"}, {**hf, "value": True}):
        assert settings(SCRIPT_KNOBS["precision"](ctx(flags=[other]))) == [{"precision": "bf16"}]


def test_precision_goes_through_a_scripts_amp_switch_and_its_dtype_flag():
    """timm's train.py: `--amp` (off) and `--amp-dtype float16`. Its own mixed precision,
    measured, comes back as the flags to pass; `--amp` without a dtype flag (fp16, emulated on
    a CPU) is left to the patch."""
    amp = {"option": "--amp", "dest": "amp", "value": False, "default": False, "type": None, "kind": "storetrue"}
    dtype = {"option": "--amp-dtype", "dest": "amp_dtype", "value": "float16", "default": "float16", "type": "str",
             "kind": "store", "choices": None}
    assert settings(SCRIPT_KNOBS["precision"](ctx(flags=[amp, dtype]))) == [
        {"args.--amp": True, "args.--amp-dtype": "bfloat16"}]
    assert settings(SCRIPT_KNOBS["precision"](ctx(flags=[amp]))) == [{"precision": "bf16"}]
    no_bf16 = {**dtype, "choices": ["float16", "float32"]}
    assert settings(SCRIPT_KNOBS["precision"](ctx(flags=[amp, no_bf16]))) == [{"precision": "bf16"}]
    assert settings(SCRIPT_KNOBS["precision"](ctx(flags=[{**amp, "value": True}, dtype]))) == [{"precision": "bf16"}]


def test_padding_goes_through_the_scripts_pad_to_max_length_or_group_by_length():
    """run_glue_no_trainer.py's `--pad_to_max_length` (store_true, on): the trial leaves it out,
    and the command handed back does too. TrainingArguments' `--group_by_length` (a bool field):
    set True. Without either, the knob is skipped with where the change goes."""
    pad = {"option": "--pad_to_max_length", "dest": "pad_to_max_length", "value": True, "default": False,
           "type": None, "kind": "storetrue"}
    [c] = SCRIPT_KNOBS["padding"](ctx(flags=[pad]))
    assert isinstance(c, Candidate) and c.label == "dynamic" and c.settings == {"args.--pad_to_max_length": False}
    command = ["python", "run_glue_no_trainer.py", "--pad_to_max_length", "--max_length", "128"]
    styles = flag_styles(ScriptFacts(targets=Targets(), flags=[pad]))
    assert apply_flags(command, {"--pad_to_max_length": False}, styles) == ["python", "run_glue_no_trainer.py",
                                                                           "--max_length", "128"]
    group = {"option": "--group_by_length", "dest": "group_by_length", "value": False, "default": False,
             "type": "string_to_bool", "kind": "store", "bare_value": True}
    [c] = SCRIPT_KNOBS["padding"](ctx(flags=[{**pad, "value": False}, group]))
    assert c.label == "group_by_length" and c.settings == {"args.--group_by_length": True}
    # a Trainer script's bool field (run_glue.py: pad_to_max_length defaults to True) is written
    # `--pad_to_max_length False`: left out, it would stay on and the trial would measure nothing
    field = {**group, "option": "--pad_to_max_length", "dest": "pad_to_max_length", "value": True, "default": True}
    [c] = SCRIPT_KNOBS["padding"](ctx(flags=[field]))
    styles = flag_styles(ScriptFacts(targets=Targets(), flags=[field]))
    assert apply_flags(["python", "run_glue.py"], c.settings and {"--pad_to_max_length": False}, styles) == [
        "python", "run_glue.py", "--pad_to_max_length", "False"]
    # its store_false twin, `--no_pad_to_max_length` (same dest), is given to set the field False,
    # as the doctor's text (script_flags.set_flag) says it
    negated = {"option": "--no_pad_to_max_length", "dest": "pad_to_max_length", "value": True, "default": True,
               "type": None, "kind": "storefalse"}
    [c] = SCRIPT_KNOBS["padding"](ctx(flags=[negated]))
    styles = flag_styles(ScriptFacts(targets=Targets(), flags=[negated]))
    assert apply_flags(["python", "run_glue.py"], {"--no_pad_to_max_length": False}, styles) == [
        "python", "run_glue.py", "--no_pad_to_max_length"] and c.settings == {"args.--no_pad_to_max_length": False}
    already = ctx(flags=[{**pad, "value": False}])
    already.facts.findings = [{"id": "padding_waste"}]  # padded per batch already, yet wasteful
    [skip] = SCRIPT_KNOBS["padding"](already)
    assert isinstance(skip, Skip) and "collate_fn" in skip.reason


def test_a_what_if_cannot_win_what_its_calls_never_cost():
    """time_sequence_prediction: its prints took 0.004 % of 35 s steps, and the one round an 8m
    budget paid for went to thinning them. A what-if whose calls took under the smallest change a
    tune calls a speedup is skipped, saying so; a script's own interval flag is still tried (on a
    GPU its branch holds the reads that wait: item_sync.py's --log-every)."""
    c = ctx(log_calls=60, save_calls=30, steps=30)
    c.facts.phase_shares = {"log": 0.00004, "ckpt": 0.2}
    [skip] = SCRIPT_KNOBS["log_every"](c)
    assert isinstance(skip, Skip) and "took 0.0% of the baseline's steps" in skip.reason and "3%" in skip.reason
    assert settings(SCRIPT_KNOBS["checkpoint_every"](c)) == [{"whatif.save_every": 4}]
    c.facts.phase_shares = {}  # unknown: tried
    assert settings(SCRIPT_KNOBS["log_every"](c)) == [{"whatif.log_every": 10}]
    flagged = ctx(log_calls=60, steps=30, flags=[{"option": "--log-every", "dest": "log_every", "value": 1,
                                                  "default": 1, "type": "int", "kind": "store"}])
    flagged.facts.phase_shares = {"log": 0.00004}
    assert settings(SCRIPT_KNOBS["log_every"](flagged)) == [{"args.--log-every": 10}]


def test_fused_and_foreach_are_offered_only_to_an_optimizer_that_has_them():
    import torch

    from trainspeed.doctor.instrument.optimizer import describe_optimizer

    w = [torch.nn.Parameter(torch.zeros(2))]
    lbfgs, adamw = describe_optimizer(torch.optim.LBFGS(w)), describe_optimizer(torch.optim.AdamW(w))
    assert lbfgs["implementations"] == [] and adamw["implementations"] == ["fused", "foreach"]
    skips = SCRIPT_KNOBS["fused_optimizer"](ctx(optimizer=lbfgs))
    assert all(isinstance(s, Skip) and "LBFGS has no" in s.reason for s in skips) and len(skips) == 2
    assert settings(SCRIPT_KNOBS["fused_optimizer"](ctx(optimizer=adamw))) == [{"optimizer.impl": "fused"},
                                                                             {"optimizer.impl": "foreach"}]
    # a run recorded before the implementations were: offered, as before
    assert len(settings(SCRIPT_KNOBS["fused_optimizer"](ctx(optimizer={"class": "AdamW", "fused": None})))) == 2


def test_trials_of_a_script_that_stops_too_soon_run_it_longer_through_its_own_flag(tmp_path):
    """nanoGPT at --max_iters=60: every trial ended after 55 of its 400 measured steps, and
    0.5 s of steps a trial read 1.0-1.9 ms/sample for one config: nothing could win."""
    from trainspeed.tune.script_session import run_longer
    from trainspeed.tune.script_trials import ScriptRunner
    from trainspeed.tune.trials import TrialRequest

    iters = {"option": "--max_iters", "dest": "max_iters", "value": 60, "type": "int", "kind": "equals"}
    runner = ScriptRunner(base_config=tmp_path / "x.yaml", out_dir=tmp_path / "trials",
                          command=["python", "train.py", "--max_iters=60"], warmup_steps=5, measure_steps=400)
    lines = []
    run_longer(runner, ctx(flags=[iters]).facts, 405, lines.append)
    assert runner.longer == {"args.--max_iters": 406}
    assert lines == ["the script stops after --max_iters=60: its trials run --max_iters=406 to measure the steps "
                     "above (your command keeps --max_iters=60; best.yaml and best.patch leave it as it is)"]
    assert runner.shape == "5+400 steps, --max_iters=406"  # a stored trial of the script's own length is not reused
    args = runner.arguments(TrialRequest(key="k", label="x", overrides=("args.--log_interval=10",), repeat=0))
    assert load_plan(args[args.index("--with") + 1]).settings == {"args.--max_iters": 406, "args.--log_interval": 10}
    # long enough already, or a length in epochs: as the script runs
    for flags in ([{**iters, "value": 5000}], [{**iters, "option": "--epochs", "dest": "epochs", "value": 1}], []):
        runner.longer = {}
        run_longer(runner, ctx(flags=flags).facts, 405, lines.append)
        assert runner.longer == {}


def test_the_baseline_line_names_every_trained_model_and_optimizer():
    """A tune of a GAN acts on both models and both optimizers: its first line says so."""
    from trainspeed.tune.script_session import _describe

    said: list[str] = []
    _describe(ScriptFacts(targets=Targets(
        model_class="Generator", model_call_site=("/w/main.py", 230), trained_classes=("Generator", "Discriminator"),
        optimizer_class="Adam", optimizer_site=("/w/main.py", 215),
        optimizer_sites=(("/w/main.py", 215), ("/w/main.py", 216)))), said.append)
    assert said == ["the baseline saw: model Generator called at /w/main.py:230 (also trained: Discriminator); "
                    "Adam built at /w/main.py:215 (and 1 more optimizer at /w/main.py:216)"]


@pytest.mark.parametrize("load,said", [(1.0, True), (0.2, False), (None, False)])
def test_a_threads_winner_on_a_busy_machine_says_whose_answer_it_is(tmp_path, monkeypatch, load, said):
    """A GAN example's threads=1 won beside a busy loop (steady: the loads matched) and went into
    best.patch with nothing said: fewer threads win there by leaving the busy cores alone."""
    from trainspeed.tune.result import Row, TuneResult
    from trainspeed.tune.script_session import write_script_outputs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import torch\nprint('hi')\n")
    best = {"threads": 1}
    result = TuneResult(ablation=[Row(knob="threads", setting="1", settings=best, verdict="faster", speedup=1.3)],
                        combination=[], best_settings=best, final=None, baseline_cost_s=1e-3, trials_run=3,
                        trials_reused=0, elapsed_s=10.0, others_load=load)
    facts = ScriptFacts(targets=Targets(script=str(tmp_path / "train.py")), cores=2)
    write_script_outputs(["python", "train.py"], result, tmp_path / "out", facts, runner=None)
    text = (tmp_path / "out" / "code_change.md").read_text()
    assert ("threads=1: measured while other processes used 1.0 of the machine's 2 cores" in text) is said, text
    assert any("measure it again" in n for n in result.notes) is said
    assert (tmp_path / "out" / "best.patch").is_file()  # the change is still there to apply


def test_skips_name_no_code_the_script_does_not_have():
    """A tune of pytorch/examples' regression (one nn.Linear, no padding) said "in your own model
    call F.scaled_dot_product_attention" and "pad each batch to its longest sample in its
    collate_fn"."""
    [attn] = SCRIPT_KNOBS["attention"](ctx())
    assert isinstance(attn, Skip) and "scaled_dot_product_attention" not in attn.reason
    [pad] = SCRIPT_KNOBS["padding"](ctx())
    assert pad.reason == "the doctor saw no padding waste in the baseline's batches"
    padded = ctx()
    padded.facts.findings = [{"id": "padding_waste"}]
    [pad] = SCRIPT_KNOBS["padding"](padded)
    assert "collate_fn" in pad.reason  # where the doctor saw the waste, it says where to cut it
