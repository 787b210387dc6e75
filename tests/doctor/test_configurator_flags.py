"""nanoGPT-style configurator scripts (nanoGPT, llama2.c and their copies): every global set
before `exec(open('configurator.py').read())` is a `--key=value` flag, typed or not. llama2.c's
train.py under the doctor said "engine: logging.every=50" and "engine: accumulation.steps=1
data.batch_size=<4x>" for settings its command line takes as --log_interval and
--gradient_accumulation_steps/--batch_size, because only the flags typed were known."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from test_checks import LOADER0, ctx_of, make_run
from trainspeed.doctor.checks import data, hardware
from trainspeed.doctor.instrument.configurator import configurator_flags

pytestmark = pytest.mark.timeout(120)

# nanoGPT's configurator.py, in its essentials: config files, then --key=value over globals()
CONFIGURATOR = '''import sys
from ast import literal_eval
for arg in sys.argv[1:]:
    if '=' not in arg:
        exec(open(arg).read())
    else:
        key, val = arg[2:].split('=')
        if key in globals():
            try:
                attempt = literal_eval(val)
            except (SyntaxError, ValueError):
                attempt = val
            assert type(attempt) == type(globals()[key])
            globals()[key] = attempt
        else:
            raise ValueError(f"Unknown config key: {key}")
'''

SCRIPT = '''import torch
out_dir = "out"
batch_size = 4
gradient_accumulation_steps = 2 * 2
log_interval = 1
max_iters = 30
learning_rate = 1e-3
compile = False
config_keys = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))]
exec(open("configurator.py").read())
after_the_configurator = 7
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=learning_rate)
for it in range(max_iters):
    for micro in range(gradient_accumulation_steps):
        loss = model(torch.randn(batch_size, 16)).pow(2).mean() / gradient_accumulation_steps
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if it % log_interval == 0:
        print(it, loss.item() * gradient_accumulation_steps)
'''


@pytest.fixture
def user(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "configurator.py").write_text(CONFIGURATOR)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "small.py").write_text("learning_rate = 3e-4\nmax_iters = 24\nunknown_here = 1\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_global_before_the_configurator_is_a_flag_with_the_value_the_run_used(user):
    rows = {r["dest"]: r for r in configurator_flags(user / "train.py", ["config/small.py", "--batch_size=8"], user)}
    # the script's defaults, arithmetic included; not what comes after the exec, nor _private names
    assert rows["gradient_accumulation_steps"]["value"] == 4 and rows["log_interval"]["value"] == 1
    assert rows["out_dir"]["value"] == "out" and rows["compile"]["value"] is False
    assert "after_the_configurator" not in rows and "config_keys" not in rows
    # a config file named as a plain argument, then --key=value, over the defaults
    assert rows["max_iters"] == {**rows["max_iters"], "value": 24, "default": 30}
    assert rows["learning_rate"]["value"] == 3e-4 and "unknown_here" not in rows
    assert rows["batch_size"]["value"] == 8 and rows["batch_size"]["default"] == 4
    assert all(r["kind"] == "equals" and r["option"] == f"--{r['dest']}" for r in rows.values())


def test_a_script_without_such_a_configurator_has_none(user):
    (user / "plain.py").write_text("batch_size = 4\nexec(open('helpers.py').read())\n")
    (user / "helpers.py").write_text("x = 1\n")  # exec'd, but sets nothing from sys.argv
    assert configurator_flags(user / "plain.py", ["--batch_size=8"], user) == []
    (user / "broken.py").write_text("batch_size = (\n")
    assert configurator_flags(user / "broken.py", [], user) == []
    assert configurator_flags(user / "missing.py", [], user) == []


def test_the_doctor_names_the_configurators_flags_and_its_verify_commands_run_them(user):
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    command = ["python", "train.py", "--batch_size=8"]
    result = run_doctor(DoctorConfig(command=command, steps=20, out=user / "run", system_sampler=False))
    assert result.steps == 20, result.traceback
    findings = {f["id"]: f for f in result.findings}
    syncs = findings["host_syncs"]
    # --log_interval was never typed: its default 1 is in train.py, and the configurator takes it
    assert "--log_interval=50" in syncs["recommendation"] and "(--log_interval=1)" in syncs["recommendation"]
    assert shlex.split(syncs["verify_with"].split(" (")[0])[-4:] == ["python", "train.py", "--batch_size=8",
                                                                       "--log_interval=50"]
    accumulation = findings["accumulation_for_speed"]
    assert ("--gradient_accumulation_steps=1 --batch_size=32: the script's flags, now "
            "--gradient_accumulation_steps=4 --batch_size=8") in accumulation["recommendation"]
    # the batch size replaced where it was typed, the accumulation added: runnable as written
    verify = shlex.split(accumulation["verify_with"])
    assert verify[:5] == ["trainspeed", "doctor", "--steps", "20", "--"]  # the run's own length
    assert verify[5:] == ["python", "train.py", "--batch_size=32", "--gradient_accumulation_steps=1"]
    flags = [json.loads(line)["data"] for line in (user / "run" / "events.jsonl").read_text().splitlines()
             if '"script_flags"' in line]
    assert flags and flags[0]["source"] == "configurator"


def test_accumulation_advice_keeps_the_engine_form_when_the_flags_do_not_read_the_factor():
    flags = {"kind": "script_flags", "source": "argparse", "site": "train.py:3", "flags": [
        {"option": "--accum", "dest": "grad_accum", "value": 2, "default": 1, "type": "int", "kind": "store"},
        {"option": "--batch-size", "dest": "batch_size", "value": 16, "default": 16, "type": "int", "kind": "store"}]}
    acc = {"kind": "accumulation", "factor": 2, "counts": {"2": 30}}
    f = hardware.accumulation_for_speed(ctx_of(make_run(obs=[acc, flags])))
    assert "--accum 1 --batch-size 32: the script's flags, now --accum 2 --batch-size 16" in f.recommendation
    assert f.verify_with.endswith("-- python train.py --accum 1 --batch-size 32")
    # a measured factor the flag does not hold (its value divided over ranks, say): the engine form
    f = hardware.accumulation_for_speed(ctx_of(make_run(obs=[{**acc, "factor": 4}, flags])))
    assert "the script's flags" not in f.recommendation and "data.batch_size=<4x>" in f.recommendation


def test_pin_memory_advice_names_where_the_loaders_are_built():
    pinned = {**LOADER0, "pin_memory": True, "site": "tinystories.py:244"}
    f = data.pin_memory_without_cuda(ctx_of(make_run(obs=[pinned, {**pinned, "role": "eval"}])))
    assert "2 DataLoader(s) (tinystories.py:244) pin memory" in f.evidence
    assert f.recommendation.startswith("set pin_memory=False at tinystories.py:244 ")


@pytest.mark.parametrize(("max_steps", "option"), [(40, " --steps 40"), (200, ""), (None, " --steps 0")],
                         ids=["typed", "default", "to-the-end"])
def test_a_verify_run_is_as_long_as_the_run_it_verifies(max_steps, option):
    """`trainspeed doctor --steps 40 -- python main.py ...` (pytorch/examples' imagenet at 1.3 s a
    step): its verify commands dropped --steps, so running one as printed took the default 200
    steps, over four minutes instead of one."""
    run = make_run(obs=[{"kind": "doctor", "max_steps": max_steps, "steps": 40}])
    run.config = {"command": ["python", "main.py", "--dummy"]}
    ctx = ctx_of(run)
    assert ctx.doctor_command() == f"trainspeed doctor{option} -- python main.py --dummy"
    assert ctx.doctor_command(steps=1000) == "trainspeed doctor --steps 1000 -- python main.py --dummy"
