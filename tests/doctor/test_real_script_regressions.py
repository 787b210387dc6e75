"""Regressions found by running the doctor and the script tuner on real third-party scripts,
unchanged, through their own flags (docs/real-scripts.md): karpathy/minGPT's chargpt and
pytorch/examples' word_language_model on a shared 2-core VM."""

from __future__ import annotations

import json
import shlex
import sys
import time

import pytest

from doctor_helpers import SCRIPTS, ids
from trainspeed.doctor.checks import diagnose
from trainspeed.telemetry.rundir import RunData

pytestmark = pytest.mark.timeout(120)

COMMAND = ["python", "chargpt.py", "--trainer.max_iters=1000", "--model.model_type=gpt-nano"]


def _run(tmp_path, others: float, *, threads: int = 2, cores: int = 2) -> RunData:
    """A 30-step script run (5 warm-up) whose system sampler saw `others` % of one core used by
    other processes all along, each step 1.12 s of wall time and 0.25 s of CPU time."""
    steps = [{"schema": 1, "step": i, "t_wall": 100.0 + 1.12 * i, "t_step": 1.12, "cpu": 0.25,
              "phases": {"forward": 0.45, "backward": 0.6, "optimizer": 0.07}, "warmup": i <= 5}
             for i in range(1, 31)]
    t = [100.0 + 0.25 * k for k in range(140)]
    events = [{"schema": 1, "type": "system", "step": 30, "t_wall": t[-1],
               "data": {"samples": len(t), "series": {"t": t, "cpu_others": [others] * len(t)}}}]
    env = {"cpu": {"available_cores": cores, "logical_cores": cores, "torch_threads": threads}}
    return RunData(path=tmp_path, env=env, config={"command": COMMAND}, steps=steps, events=events)


def _short_steps_run(tmp_path, n: int, warmup: int, step_s: float, cpu_s: float, t: list, others: list) -> RunData:
    """A run of `n` short steps (`warmup` of them warm-up) from t_wall 100.0 on, whose system
    sampler read `others` % of one core at times `t`."""
    steps = [{"schema": 1, "step": i, "t_wall": 100.0 + step_s * i, "t_step": step_s, "cpu": cpu_s,
              "phases": {"forward": step_s * 0.43, "backward": step_s * 0.43}, "warmup": i <= warmup}
             for i in range(1, n + 1)]
    events = [{"schema": 1, "type": "system", "step": n, "t_wall": t[-1],
               "data": {"samples": len(t), "series": {"t": t, "cpu_others": others}}}]
    env = {"cpu": {"available_cores": 2, "logical_cores": 2, "torch_threads": 2}}
    return RunData(path=tmp_path, env=env, config={"command": COMMAND}, steps=steps, events=events)


def _summary(**kw):
    return {"steps": 30, "measured_steps": 25, "cpu_per_step": 0.25, "contention": None,
            "step_time": {"p50": 1.12, "mean": 1.12}, "device": "cpu",
            "phases": {"forward": {"mean_s": 0.45, "share": 0.4}, "backward": {"mean_s": 0.6, "share": 0.54}}, **kw}


def _parse(command: str):
    from trainspeed.cli.main import build_parser

    return build_parser().parse_args(shlex.split(command)[1:])


@pytest.mark.timeout(30)
def test_a_run_loaded_from_start_to_end_is_said_to_be_the_machines(tmp_path):
    # chargpt beside a test suite: others used 1.6 of 2 cores through the whole run, so no step
    # got slower (machine_contention had no change to find) and the report read 700 ms steps
    # (20 s for its 500-token sample with 2 threads; 1 s with one) as the script's, silently.
    findings = diagnose(_run(tmp_path, others=160.0), _summary())
    busy = next(f for f in findings if f["id"] == "machine_busy")
    assert busy["severity"] == "warning" and busy["impact"] == 0.0
    assert "1.6 of the machine's 2 cores" in busy["evidence"]
    assert "got 0.22 cores with 2 compute threads" in busy["evidence"]
    # every command it names runs as written: the doctor again, and the script tune of threads
    assert busy["verify_with"].endswith(" (on a quiet machine)")
    doctor = _parse(busy["verify_with"].removesuffix(" (on a quiet machine)"))
    assert doctor.command[-len(COMMAND):] == COMMAND
    tune_cmd = busy["recommendation"].split("`")[1]
    assert tune_cmd == "trainspeed tune --knobs threads -- " + shlex.join(COMMAND)
    tune = _parse(tune_cmd)
    assert [tune.target, *tune.rest] == COMMAND and tune.knobs == "threads"
    # nothing at stake: it never ranks above a finding that can win time, but above 0 % infos
    assert findings.index(busy) == min(i for i, f in enumerate(findings) if not f.get("impact"))


@pytest.mark.timeout(30)
def test_the_where_time_goes_line_of_a_loaded_run_says_whose_time_it_is(tmp_path):
    # nanoGPT beside a neighbour: "compute-bound: 90 % of the step is the model's forward,
    # backward and update at 0.3 % of cpu", at 55x its quiet step time, and nothing said why
    from trainspeed.doctor.checks.bound import time_goes

    found = time_goes(_run(tmp_path, others=160.0), _summary())
    assert found["bound"] == "compute"
    assert found["statement"].endswith("; other processes held 1.6 of the 2 cores meanwhile: these are the busy "
                                       "machine's times, not the script's (machine_busy below)"), found["statement"]
    assert found["helps"][0] == "measuring on a quiet machine (or cores of the run's own)"
    assert found["verify_with"].startswith("trainspeed tune --knobs threads,precision,compile -- ")
    quiet = time_goes(_run(tmp_path, others=10.0), _summary())
    assert "other processes" not in quiet["statement"] and "threads" not in quiet["verify_with"]


@pytest.mark.timeout(30)
def test_no_busy_machine_alarm_on_a_quiet_or_lightly_shared_machine(tmp_path):
    assert "machine_busy" not in [f["id"] for f in diagnose(_run(tmp_path, others=30.0), _summary())]
    # half a core taken on 16 cores is not worth a word either
    assert "machine_busy" not in [f["id"] for f in diagnose(_run(tmp_path, others=90.0, cores=16), _summary())]
    # one compute thread: the load is still said, without advice to lower the threads
    one = next(f for f in diagnose(_run(tmp_path, others=160.0, threads=1), _summary()) if f["id"] == "machine_busy")
    assert "tune --knobs threads" not in one["recommendation"]


@pytest.mark.timeout(30)
def test_measured_steps_shorter_than_the_sampler_are_judged_on_the_whole_runs_readings(tmp_path):
    # chargpt on the 2-core CI machine beside 4 burners: 100 steps of ~7 ms, so its measured
    # steps held 2 of the sampler's 0.25 s readings and the doctor said nothing of the load
    t = [99.5 + 0.25 * k for k in range(6)]  # 99.5 .. 100.75: two readings inside steps 11-100
    others = [150.0, 150.0, 170.0, 160.0, 160.0, 150.0]
    run = _short_steps_run(tmp_path, 100, 10, 0.007, 0.002, t, others)
    steps, events, env = run.steps, run.events, run.env
    summary = _summary(steps=100, measured_steps=90, cpu_per_step=0.002, step_time={"p50": 0.007, "mean": 0.007})
    busy = next(f for f in diagnose(run, summary) if f["id"] == "machine_busy")
    assert "a median 1.6 of the machine's 2 cores while the run ran (system sampler)" in busy["evidence"]
    # one reading in all is not a load through the run
    one = [{**events[0], "data": {"samples": 1, "series": {"t": t[:1], "cpu_others": others[:1]}}}]
    run_one = RunData(path=tmp_path, env=env, config={"command": COMMAND}, steps=steps, events=one)
    assert "machine_busy" not in [f["id"] for f in diagnose(run_one, summary)]


@pytest.mark.timeout(30)
def test_others_are_never_read_as_more_than_the_cores_the_process_left(tmp_path):
    """nanoGPT's 55 steps of 9.5 ms held no sampler reading; the whole run's median (a neighbour
    that left before the steps) read 'others used 1.0 of 2 cores' beside 'this process got 1.70
    cores', and called the run's figures the busy machine's."""
    t = [98.5 + 0.5 * k for k in range(6)]  # one reading inside the measured steps
    run = _short_steps_run(tmp_path, 60, 5, 0.0095, 0.016, t, [98.0, 100.0, 98.0, 4.0, 4.0, 4.0])
    summary = _summary(steps=60, measured_steps=55, cpu_per_step=0.016, step_time={"p50": 0.0095, "mean": 0.0095})
    assert "machine_busy" not in [f["id"] for f in diagnose(run, summary)]
    # a process that left a core free while the whole run read 1.6: at most that core, said so
    busy_run = _short_steps_run(tmp_path, 60, 5, 0.0095, 0.016, t, [160.0] * 6)
    slow = _summary(steps=60, measured_steps=55, cpu_per_step=0.0095, step_time={"p50": 0.0095, "mean": 0.0095})
    busy = next(f for f in diagnose(busy_run, slow) if f["id"] == "machine_busy")
    assert ("a median 1.0 of the machine's 2 cores at most, while the measured steps ran (this process used the "
            "rest; the sampler's median while the run ran was 1.6) (system sampler); this process got 1.00 cores"
            ) in busy["evidence"], busy["evidence"]


@pytest.mark.timeout(30)
def test_contention_whose_quiet_steps_were_loaded_too_says_so(tmp_path):
    # word_language_model: steps 17-59 69 % slower at 1.6 cores of others "vs 1.4" in the quiet
    # steps: the finding read as if the quiet steps were the script's own speed
    contention = {"first_step": 17, "last_step": 29, "loaded_steps": 8, "quiet_steps": 17, "wall_quiet": 0.25,
                  "wall_loaded": 0.42, "cpu_quiet": 0.155, "cpu_loaded": 0.17, "others_quiet": 138.0,
                  "others_loaded": 159.0, "slowdown": 0.69, "cpu_change": 0.09, "lost_share": 0.23, "sampled": True,
                  "message": "steps 17-29 (8 steps) took 69 % longer (246.5 -> 417.5 ms) while other processes "
                             "used 1.6 cores (vs 1.4)"}
    findings = diagnose(_run(tmp_path, others=160.0), _summary(contention=contention))
    found = [f for f in findings if f["id"] in ("machine_contention", "machine_busy")]
    assert [f["id"] for f in found] == ["machine_contention"]  # one finding about the load, not two
    assert "Even the quiet steps ran beside 1.4 of the machine's 2 cores" in found[0]["evidence"]
    assert "tune --knobs threads -- " + shlex.join(COMMAND) in found[0]["recommendation"]


def _burners(marker, seconds: float, count: int) -> list[int]:
    from test_contention_stories import _burners as start

    return start(marker, seconds, count)


@pytest.mark.timeout(150)
@pytest.mark.alone
def test_chargpt_style_script_beside_other_jobs_reports_the_load(doctor, tmp_path):
    # The real story end to end: a minGPT-style script (config overrides, a with-replacement
    # sampler, a sample + save at iteration 0) run by the doctor while other processes hold the
    # cores from before its first step to after its last.
    from test_contention_stories import _kill

    marker = tmp_path / "marker"
    marker.mkdir()
    (marker / "on").touch()
    pids = _burners(marker, seconds=90.0, count=2 * 2)
    try:
        time.sleep(0.5)
        result = doctor("chargpt_style.py", "--trainer.max_iters=1000", "--trainer.num_workers=0", steps=100,
                        system_sampler=True)
    finally:
        (marker / "off").touch()
        _kill(pids)
    assert (result.stopped, result.steps, result.exit_code) == ("steps", 100, 0)
    load = [f for f in result.findings if f["id"] in ("machine_busy", "machine_contention")]
    assert load, ids(result)
    assert "of the machine's" in load[0]["evidence"] and load[0]["impact"] == 0.0
    report = json.loads((result.run_dir / "report.json").read_text())
    assert any(f["id"] == load[0]["id"] for f in report["findings"])
    # its re-run command is the recorded command under the doctor
    rerun = load[0]["verify_with"].removesuffix(" (on a quiet machine)")
    assert shlex.split(rerun)[-3:] == [str(SCRIPTS / "chargpt_style.py"), "--trainer.max_iters=1000",
                                       "--trainer.num_workers=0"]


@pytest.mark.timeout(120)
def test_manual_sgd_loop_compiled_in_place_still_has_its_steps(doctor, monkeypatch):
    # word_language_model's compile trial: module.compile() runs the module's hooks inside the
    # compiled graph, so after the first call no training forward was seen (1 forward, 125
    # backwards) and a loop without an optimizer had no step at all ("no measured steps"). Then
    # the steps came from the backwards alone, and the forward read as "other"; now the hooks
    # run around the compiled call (compiled_calls.py) and every forward is seen.
    # The backend is dynamo's "eager" here: the same hooks disappear, without inductor's minutes.
    import torch

    from trainspeed.patches import install_settings

    original = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: original(self, backend="eager"))
    save = torch.save
    applied = install_settings({"compile": "default"}, None, say=lambda text: None)
    try:
        result = doctor("word_lm_manual_sgd.py", steps=12)
    finally:
        applied.uninstall()
    # both layers undone in order (settings, then the doctor inside them): torch.save is torch's
    # again (it was the doctor's wrapper when the settings wrapped it while the script ran)
    assert torch.save is save
    assert any("compiled in place" in n for n in applied.notes), applied.notes
    assert (result.stopped, result.steps, result.exit_code) == ("steps", 12, 0)
    boundary = next(json.loads(line)["data"] for line in (result.run_dir / "events.jsonl").read_text().splitlines()
                    if '"step_boundary"' in line)
    assert boundary["source"] == "backward" and boundary["forwards"] >= boundary["backwards"] >= 12
    assert not boundary["unseen_forward_steps"]
    steps = [json.loads(line) for line in (result.run_dir / "steps.jsonl").read_text().splitlines()]
    # each step keeps the batch its loop feeds: 20 sequences of 35 tokens, 34 in each epoch's
    # 12th (its corpus holds 419 positions to predict), as the forwards showed
    assert {s["samples"] for s in steps} == {20} and 700 in {s["tokens"] for s in steps} <= {700, 680}
    assert "no_step_found" not in ids(result)


@pytest.mark.timeout(30)
def test_contention_that_made_the_threads_spin_names_the_threads_tune(tmp_path):
    # chargpt on 2 threads when another job took 1.3 cores at step 20: wall 23.0 -> 245.6 ms and
    # its own CPU time per step 41.6 -> 154.5 ms (spinning threads); the quiet steps were quiet
    def contention(cpu_loaded):
        return {"first_step": 20, "last_step": 29, "loaded_steps": 10, "quiet_steps": 15, "wall_quiet": 0.023,
                "wall_loaded": 0.2456, "cpu_quiet": 0.0416, "cpu_loaded": cpu_loaded, "others_quiet": 20.0,
                "others_loaded": 130.0, "slowdown": 9.66, "cpu_change": cpu_loaded / 0.0416 - 1.0, "lost_share": 0.94,
                "sampled": True, "message": "steps 20-29 (10 steps) took 966 % longer (23.0 -> 245.6 ms)"}

    spun = next(f for f in diagnose(_run(tmp_path, others=130.0), _summary(contention=contention(0.1545)))
                if f["id"] == "machine_contention")
    assert "rose 3.7x under the load with 2 compute threads" in spun["evidence"]
    assert "`trainspeed tune --knobs threads -- " + shlex.join(COMMAND) + "`" in spun["recommendation"]
    assert "Even the quiet steps" not in spun["evidence"]
    calm = next(f for f in diagnose(_run(tmp_path, others=130.0), _summary(contention=contention(0.045)))
                if f["id"] == "machine_contention")
    assert "knobs threads" not in calm["recommendation"] and "compute threads" not in calm["evidence"]


FIRE_CORE = '''
import argparse, sys


def Fire(fn):
    # python-fire's shape: its own options parsed with argparse, the script's mapped onto fn
    parser = argparse.ArgumentParser(prog="fire")
    for flag in ("--verbose", "--interactive", "--trace", "--completion"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--separator", default="-")
    parser.parse_args([])
    args = sys.argv[1:]
    return fn(**{args[i][2:]: int(args[i + 1]) for i in range(0, len(args), 2)})
'''

FIRE_SCRIPT = '''
import fire
import torch
from torch import nn


def train(steps=100, batch_size=8):
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(batch_size, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    fire.Fire(train)
'''


@pytest.mark.timeout(60)
def test_fires_own_options_are_not_the_scripts_flags(doctor, tmp_path, monkeypatch):
    # DeepSpeedExamples' HelloDeepSpeed takes its flags through fire.Fire(train): the doctor
    # recorded fire's own argparse parser (--verbose, --trace...) as the script's six flags
    site = tmp_path / "venv" / "lib" / "site-packages"
    (site / "fire").mkdir(parents=True)
    (site / "fire" / "__init__.py").write_text("from fire.core import Fire\n")
    (site / "fire" / "core.py").write_text(FIRE_CORE)
    monkeypatch.syspath_prepend(str(site))
    script = tmp_path / "train_fire.py"
    script.write_text(FIRE_SCRIPT)
    try:
        result = doctor(str(script), "--steps", "30", "--batch_size", "4", steps=12)
    finally:  # the stand-in must not be the `fire` of later tests
        for name in ("fire", "fire.core"):
            sys.modules.pop(name, None)
    assert (result.stopped, result.steps) == ("steps", 12), result.traceback
    events = [json.loads(line) for line in (result.run_dir / "events.jsonl").read_text().splitlines()]
    flags = [e["data"] for e in events if e["type"] == "observation" and e["data"].get("kind") == "script_flags"]
    assert not any(f["option"] == "--verbose" for obs in flags for f in obs["flags"]), flags


@pytest.mark.timeout(120)
def test_a_model_compiled_in_place_has_its_forward_and_samples(doctor):
    # `model.compile()` swaps in torch.compile(model._call_impl): the forward hooks then ran
    # inside dynamo and did nothing. The report read "throughput —", put the forward (30 % of
    # the step) in "other", told its author to call the module rather than its `forward`, and
    # its "Measure it" line named the compile knob for a model already compiled.
    import torch

    compile_before = torch.compile
    result = doctor("compiled_in_place.py", "--backend", "eager", "--batch", "24", steps=20)
    assert (result.stopped, result.steps, result.exit_code) == ("steps", 20, 0)
    assert torch.compile is compile_before  # the doctor's wrapper is undone with its patches
    steps = [json.loads(line) for line in (result.run_dir / "steps.jsonl").read_text().splitlines()]
    assert {s["samples"] for s in steps} == {24}
    assert all(s["phases"].get("forward", 0) > 0 for s in steps), steps[-1]["phases"]
    report = json.loads((result.run_dir / "report.json").read_text())
    events = [json.loads(line) for line in (result.run_dir / "events.jsonl").read_text().splitlines()]
    observed = [e["data"] for e in events if e["type"] == "observation"]
    models = [o for o in observed if o["kind"] == "model"]
    assert [(m["class"], m["compiled"], m["call_site"]) for m in models] == [
        ("Sequential", True, f"{SCRIPTS / 'compiled_in_place.py'}:21")]
    goes = report["time_goes"]
    assert not any("calling the module" in h for h in goes["helps"]), goes["helps"]
    assert "compile" not in (goes["verify_with"] or "").split("--knobs ")[-1].split(" ")[0].split(","), goes
    assert "not_compiled" not in ids(result)
    boundary = next(o for o in observed if o["kind"] == "step_boundary")
    assert boundary["forwards"] >= 20 and not boundary["unseen_forward_steps"]
