"""Reading a trial's run directory, classifying failures, and the resume store."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from trainspeed.config import load_config
from trainspeed.telemetry import read_run
from trainspeed.tune import forkserver
from trainspeed.tune.session import TrialLength, parse_budget, trial_config
from trainspeed.tune.store import TrialStore
from trainspeed.tune.trials import (
    SubprocessRunner,
    TrialRequest,
    TrialResult,
    format_override,
    result_from_run_dir,
)

REQ = TrialRequest(key="k", label="baseline", overrides=(), repeat=0)


def write_run(path, losses, warm=2, eval_loss=None, samples=8, flops=None, peak=None):
    path.mkdir(parents=True)
    with (path / "steps.jsonl").open("w") as f:
        for i, loss in enumerate(losses):
            f.write(json.dumps({"schema": 1, "step": i + 1, "t_step": 0.1 + 0.01 * i,
                                "samples": samples, "loss": loss, "warmup": i < warm,
                                "mem": {"rss": 1000 + i}}) + "\n")
    with (path / "events.jsonl").open("w") as f:
        if eval_loss is not None:
            f.write(json.dumps({"schema": 1, "type": "eval", "step": len(losses),
                                "data": {"val_loss": eval_loss}}) + "\n")
        if peak is not None:
            f.write(json.dumps({"schema": 1, "type": "peak_flops", "step": 0, "data": {
                "name": "cpu (2 threads)", "dtype": "fp32", "flops": peak, "source": "measured"}}) + "\n")
        if flops is not None:
            f.write(json.dumps({"schema": 1, "type": "flops", "step": 0,
                                "data": {"flops_per_step": flops}}) + "\n")
    return path


def test_result_excludes_warmup_and_prefers_the_validation_loss(tmp_path):
    run = write_run(tmp_path / "r", [5.0, 4.0, 3.0, 2.0, 1.0, 1.0], warm=2, eval_loss=1.5)
    res = result_from_run_dir(REQ, run, wall_s=3.0)
    assert res.ok and res.step_times == pytest.approx([0.12, 0.13, 0.14, 0.15])
    assert res.warmup_s == pytest.approx(0.10 + 0.11)  # the warm-up steps' wall time (compilation)
    assert res.samples == [8.0] * 4
    assert res.loss == 1.5
    assert res.memory_peak == 1005


def test_slow_first_steps_after_the_warm_up_are_warm_up_too(tmp_path):
    """An image library's compile trial: a 39 s step after the declared warm-up was measured,
    and its row read 0.14x while its steps ran at 0.71-0.85x. Steps far slower than the
    trial's steady ones, from its first measured step on, move to the warm-up (and so to the
    setting's one-time cost); a slow step later in the trial stays measured."""
    from trainspeed.tune.settle import settled_from

    path = tmp_path / "r"
    times = [2.0, 0.2, 39.0, 1.5, 0.1, 0.1, 0.11, 0.1, 0.5, 0.1, 0.1, 0.1]  # warm-up: the first two
    path.mkdir()
    (path / "events.jsonl").write_text("")
    with (path / "steps.jsonl").open("w") as f:
        for i, t in enumerate(times):
            f.write(json.dumps({"schema": 1, "step": i + 1, "t_step": t, "samples": 8, "loss": 1.0,
                                "warmup": i < 2, "mem": {"rss": 1}}) + "\n")
    res = result_from_run_dir(REQ, path, wall_s=50.0)
    assert res.step_times == pytest.approx([0.1, 0.1, 0.11, 0.1, 0.5, 0.1, 0.1, 0.1])
    assert res.warmup_s == pytest.approx(2.0 + 0.2 + 39.0 + 1.5)
    assert settled_from([0.1] * 10) == 0 and settled_from([9.0] * 3 + [0.1]) == 0  # too few to judge
    assert settled_from([5.0] * 7 + [0.1] * 5) == 6  # never more than half


def test_the_step_that_counted_flops_is_priced_as_an_ordinary_warm_up_step(tmp_path):
    """time_sequence_prediction's first trial: its FLOP-counted step took 216 s beside 38 s steps,
    and every later trial (which counts none) was priced with that warm-up: 338 s, not ~155 s."""
    path = tmp_path / "r"
    times = [43.8, 216.2, 38.0, 34.8, 42.5]
    path.mkdir()
    (path / "events.jsonl").write_text(json.dumps({"schema": 1, "type": "flops", "step": 2,
                                                   "data": {"flops_per_step": 3.65e11}}) + "\n")
    with (path / "steps.jsonl").open("w") as f:
        for i, t in enumerate(times):
            f.write(json.dumps({"schema": 1, "step": i + 1, "t_step": t, "samples": 97, "loss": 1.0,
                                "warmup": i < 2, "mem": {"rss": 1}}) + "\n")
    res = result_from_run_dir(REQ, path, wall_s=377.0)
    assert res.step_times == pytest.approx([38.0, 34.8, 42.5])
    assert res.warmup_s == pytest.approx(43.8 + 38.0)  # the counted step as the median step
    # a count of none (skipped: too slow for the time limit) leaves the warm-up as it ran
    (path / "events.jsonl").write_text(json.dumps({"schema": 1, "type": "flops", "step": 2,
                                                   "data": {"flops_per_step": None, "skipped": "why"}}) + "\n")
    assert result_from_run_dir(REQ, path, wall_s=377.0).warmup_s == pytest.approx(43.8 + 216.2)


def test_result_reads_mfu_at_the_median_measured_step(tmp_path):
    # measured steps 0.12..0.15 s: median 0.135 s; 2.7e9 FLOPs a step on a 4e10 FLOP/s peak
    run = write_run(tmp_path / "r", [5.0, 4.0, 3.0, 2.0, 1.0, 1.0], warm=2, flops=2.7e9, peak=4e10)
    res = result_from_run_dir(REQ, run, wall_s=3.0)
    assert res.mfu == pytest.approx(2.7e9 / 0.135 / 4e10)  # 0.5
    assert res.peak_name == "cpu (2 threads) fp32 (measured)"
    # Without a FLOP count (or a peak) there is no MFU, and no peak named for it.
    bare = result_from_run_dir(REQ, write_run(tmp_path / "b", [3.0] * 6, peak=4e10), 1.0)
    assert bare.mfu is None and bare.peak_name is None
    # A resume store written before MFU existed still loads.
    old = {k: v for k, v in res.to_json().items() if k not in ("mfu", "peak_name")}
    assert TrialResult.from_json(old).mfu is None


def test_result_falls_back_to_the_training_loss_tail_and_catches_overflow(tmp_path):
    res = result_from_run_dir(REQ, write_run(tmp_path / "a", [4, 3, 2, 2, 1, 1, 1, 1]), 1.0)
    assert res.loss == pytest.approx(1.0)  # mean of the last quarter
    assert res.loss_start == pytest.approx((4 + 3 + 2 + 2 + 1) / 5)  # the scale parity weighs a delta on
    bad = result_from_run_dir(REQ, write_run(tmp_path / "b", [4, 3, 2, 2, 1, 1, 1, float("inf")]), 1.0)
    assert bad.loss == math.inf


def test_a_run_with_only_warmup_steps_is_a_failure_that_says_what_to_do(tmp_path):
    res = result_from_run_dir(REQ, write_run(tmp_path / "r", [3.0, 2.0], warm=5), 1.0)
    assert not res.ok and "raise the trial's step count (--steps)" in res.error  # stopped by the tune, not the script


def test_epoch_starts_come_from_a_real_runs_epoch_events(tmp_path):
    # 40 samples in batches of 8: 5 steps per epoch; 12 steps, 2 of warm-up. Steps 6 and 11
    # begin epochs 2 and 3 (the run's first epoch start, step 1, is warm-up and not marked).
    import torch

    from trainspeed import Trainer

    data = torch.utils.data.TensorDataset(torch.randn(40, 4), torch.randn(40, 1))
    cfg = load_config({"run": {"max_steps": 12, "out_dir": str(tmp_path), "name": "r"},
                       "data": {"batch_size": 8}, "logging": {"sinks": ["jsonl"], "warmup_steps": 2,
                                                             "progress": False}})
    model = torch.nn.Linear(4, 1)
    trainer = Trainer(model, lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]), data, config=cfg)
    trainer.fit()
    res = result_from_run_dir(REQ, trainer.run_dir, 1.0)
    assert res.steps_per_epoch == 5
    assert [i + 3 for i, start in enumerate(res.epoch_starts) if start] == [6, 11]
    assert len(res.epoch_starts) == len(res.step_times) == 10


def test_a_run_within_one_epoch_marks_no_epoch_start(tmp_path):
    res = result_from_run_dir(REQ, write_run(tmp_path / "r", [3.0, 2.0, 1.0, 1.0]), 1.0)
    assert res.epoch_starts == [] and res.steps_per_epoch is None


def test_trial_length_reaches_one_epoch_start_when_epochs_are_short():
    length = TrialLength(warmup_steps=5, measure_steps=25)
    assert length.steps(None) == 30
    assert length.steps(50) == 55  # first start at step 51, then 4 steps of loader refill
    assert length.steps(10) == 30  # steps 11, 21 already start epochs inside the 30
    assert length.steps(3) == 30   # starts at 7, 10, ...: after the warm-up, inside
    assert length.steps(200) == 30  # 205 steps would be 7x the trial: its start weighs 1/200
    cfg = load_config({"recipe": {"name": "gpt"}})
    assert trial_config(cfg, length, steps_per_epoch=50)["run"]["max_steps"] == 55


def test_overrides_round_trip_through_the_config_loader():
    values = {"precision.mode": "bf16-mixed", "compile.mode": "off", "data.pin_memory": True,
              "data.prefetch_factor": None, "activation_checkpointing": ["Block"],
              "logging.sinks": ["jsonl"], "data.batch_size": 64}
    cfg = load_config({"recipe": {"name": "gpt"}, "data": {"num_workers": 2}},
                      [format_override(k, v) for k, v in values.items()])
    assert cfg.precision.mode == "bf16-mixed" and cfg.compile.mode == "off"
    assert cfg.data.pin_memory is True and cfg.data.prefetch_factor is None
    assert cfg.activation_checkpointing == ["Block"] and cfg.data.batch_size == 64


def test_subprocess_failure_keeps_the_error_tail(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("recipe: {name: gpt}\nrun: {max_steps: 2, max_epochs: null}\n")
    runner = SubprocessRunner(base_config=base, out_dir=tmp_path / "trials", timeout_s=60,
                              python=sys.executable)
    bad = TrialRequest(key="x", label="typo", overrides=("data.num_wrokers=2",), repeat=0)
    res = runner(bad)
    assert not res.ok and "exit code 2" in res.error
    assert "did you mean 'data.num_workers'" in res.error


def test_store_resumes_and_skips_a_line_cut_by_a_crash(tmp_path):
    store = TrialStore(tmp_path)
    store.add(TrialResult(key="a", label="baseline", repeat=0, ok=True, step_times=[0.1], samples=[4]))
    store.add(TrialResult(key="a", label="baseline", repeat=1, ok=False, error="OOM"))
    with store.path.open("a") as f:
        f.write('{"key": "b", "label": "x", "rep')  # killed mid-write
    again = TrialStore(tmp_path)
    assert len(again) == 2 and again.skipped_lines == 1
    assert again.get("a", 0).step_times == [0.1]
    assert again.get("a", 1).error == "OOM"
    assert again.get("b", 0) is None


def test_trial_config_shortens_the_run_but_keeps_the_speed_settings():
    cfg = load_config({"recipe": {"name": "gpt"}, "data": {"num_workers": 2},
                       "checkpoint": {"every_steps": 100, "resume": "latest"},
                       "eval": {"every_steps": 50, "limit_val_batches": 20}})
    d = trial_config(cfg, TrialLength(warmup_steps=3, measure_steps=10, eval_batches=4))
    assert d["run"]["max_steps"] == 13 and d["run"]["max_epochs"] is None
    assert d["logging"]["warmup_steps"] == 3
    assert d["data"]["num_workers"] == 2 and d["checkpoint"]["every_steps"] == 100
    assert d["checkpoint"]["resume"] is None and d["checkpoint"]["save_final"] is False
    assert d["eval"] == {**d["eval"], "every_steps": None, "at_end": True, "limit_val_batches": 4}
    load_config(d)  # still a valid config


def test_parse_budget():
    assert parse_budget("10m") == 600 and parse_budget("90s") == 90 and parse_budget("1h") == 3600
    assert parse_budget("45") == 45
    from trainspeed.errors import ConfigError

    with pytest.raises(ConfigError, match="not a duration"):
        parse_budget("ten minutes")
    with pytest.raises(ConfigError, match="positive"):
        parse_budget("0m")


@pytest.mark.parametrize("sig", ["TERM", "USR1"])  # USR1: SLURM signals every process of the job step
def test_a_trial_stopped_by_a_signal_interrupts_the_tune_instead_of_failing(tmp_path, sig):
    script = tmp_path / "fake_python"
    script.write_text(f"#!/bin/sh\nkill -{sig} $$\n")
    script.chmod(0o755)
    runner = SubprocessRunner(base_config=tmp_path / "base.yaml", out_dir=tmp_path / "trials",
                              python=str(script), fork_server=False)
    with pytest.raises(KeyboardInterrupt, match="stopped by a signal"):
        runner(REQ)


def test_a_trial_far_slower_than_the_baseline_is_stopped_at_its_cutoff(tmp_path):
    script = tmp_path / "fake_python"
    script.write_text("#!/bin/sh\nsleep 30\n")
    script.chmod(0o755)
    runner = SubprocessRunner(base_config=tmp_path / "base.yaml", out_dir=tmp_path / "trials",
                              python=str(script), timeout_s=600, fork_server=False)
    slow = TrialRequest(key="s", label="precision=fp16-mixed", overrides=(), repeat=0, timeout_s=0.5)
    res = runner(slow)
    assert not res.ok and res.error.startswith("far slower") and res.wall_s < 10
    capped = TrialRequest(key="c", label="x", overrides=(), repeat=0)
    runner.timeout_s = 0.5  # no per-trial cutoff: the runner's own cap, reported as a timeout
    assert runner(capped).error == "timed out after 0 s"


TINY_GPT = ("recipe: {name: gpt, options: {size: tiny, block_size: 32}}\n"
            "run: {max_steps: 3, max_epochs: null}\ndata: {batch_size: 2}\n"
            "logging: {every: 1, progress: false, warmup_steps: 0}\n"
            "eval: {at_end: false}\ncheckpoint: {save_final: false}\n")


def _pids_and_losses(run_dir):
    run = read_run(run_dir)
    start = next(e for e in run.events if e["type"] == "run_start")
    return start["data"]["pid"], [s["loss"] for s in run.steps]


@pytest.mark.skipif(not forkserver.available(), reason="fork servers need Linux")
def test_forked_trials_are_fresh_processes_with_the_same_results_as_new_interpreters(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(TINY_GPT)
    forked = SubprocessRunner(base_config=base, out_dir=tmp_path / "forked", timeout_s=120)
    fresh = SubprocessRunner(base_config=base, out_dir=tmp_path / "fresh", timeout_s=120, fork_server=False)
    try:
        a = forked(TrialRequest(key="b", label="baseline", overrides=(), repeat=0))
        b = forked(TrialRequest(key="b", label="baseline", overrides=(), repeat=1))
        server_pid = forked._server._proc.pid
    finally:
        forked.close()
    c = fresh(TrialRequest(key="b", label="baseline", overrides=(), repeat=0))
    assert a.ok and b.ok and c.ok
    (pid_a, loss_a), (pid_b, loss_b), (_, loss_c) = (_pids_and_losses(r.run_dir) for r in (a, b, c))
    assert len({pid_a, pid_b, server_pid}) == 3  # each trial its own process, none the server
    assert len(loss_a) == 3 and loss_a == loss_b == loss_c  # same seed, same losses, either way


@pytest.mark.skipif(not forkserver.available(), reason="fork servers need Linux")
def test_a_forked_trial_past_its_cutoff_is_killed_and_the_server_runs_the_next(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(TINY_GPT.replace("max_steps: 3", "max_steps: 100000"))
    runner = SubprocessRunner(base_config=base, out_dir=tmp_path / "trials", timeout_s=120)
    try:
        slow = runner(TrialRequest(key="s", label="precision=fp16-mixed", overrides=(), repeat=0, timeout_s=3))
        assert not slow.ok and slow.error.startswith("far slower") and slow.wall_s < 20
        ok = runner(TrialRequest(key="b", label="baseline", overrides=("run.max_steps=3",), repeat=0))
        assert ok.ok and runner._server is not None  # the same server, still forking
    finally:
        runner.close()


def test_a_fork_server_that_cannot_start_falls_back_to_new_interpreters(tmp_path):
    script = tmp_path / "fake_python"
    script.write_text("#!/bin/sh\necho \"no such module\" >&2\nexit 3\n")
    script.chmod(0o755)
    said = []
    runner = SubprocessRunner(base_config=tmp_path / "base.yaml", out_dir=tmp_path / "trials",
                              python=str(script), say=said.append)
    res = runner(REQ)
    assert not res.ok and "exit code 3" in res.error and "no such module" in res.error
    if forkserver.available():
        assert runner.fork_server is False and runner._server is None
        assert said and "fresh interpreters" in said[0] and "did not start" in said[0]


def _module(tmp_path, name, body, monkeypatch):
    """A module the fork server can import (through PYTHONPATH, which it inherits)."""
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


@pytest.mark.skipif(not forkserver.available(), reason="fork servers need Linux")
def test_the_server_imports_the_preload_once_and_skips_what_fails(tmp_path, monkeypatch):
    marker = tmp_path / "imported_by.txt"
    _module(tmp_path, "ts_marker_mod", f"import os\nopen({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n",
            monkeypatch)
    # A script-like module that parses argv and exits at import: skipped, the server lives on.
    _module(tmp_path, "ts_exit_mod", "import sys\nif sys.argv[1:]:\n    sys.exit(2)\nsys.exit(3)\n", monkeypatch)
    base = tmp_path / "base.yaml"
    base.write_text(TINY_GPT)
    runner = SubprocessRunner(base_config=base, out_dir=tmp_path / "trials", timeout_s=120,
                              preload=("ts_marker_mod", "ts_no_such_module", "ts_exit_mod"))
    try:
        a = runner(TrialRequest(key="b", label="baseline", overrides=(), repeat=0))
        b = runner(TrialRequest(key="b", label="baseline", overrides=(), repeat=1))
        server = runner._server
        assert a.ok and b.ok and server is not None
        # Imported once, by the server: the trials forked from it inherit the module.
        assert marker.read_text().split() == [str(server._proc.pid)]
        # A module that does not import is skipped, not fatal: the trial imports it itself.
        no_module, exits = server.skipped
        assert no_module.startswith("ts_no_such_module: ModuleNotFoundError")
        assert exits == "ts_exit_mod: SystemExit: 3"  # the server's argv is empty: the list came on stdin
    finally:
        runner.close()


@pytest.mark.skipif(not forkserver.available(), reason="fork servers need Linux")
def test_a_preload_that_starts_a_thread_gets_a_server_without_it(tmp_path, monkeypatch):
    _module(tmp_path, "ts_thread_mod", "import threading, time\n"
            "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n", monkeypatch)
    base = tmp_path / "base.yaml"
    base.write_text(TINY_GPT)
    said = []
    runner = SubprocessRunner(base_config=base, out_dir=tmp_path / "trials", timeout_s=120,
                              preload=("ts_thread_mod",), say=said.append)
    try:
        res = runner(TrialRequest(key="b", label="baseline", overrides=(), repeat=0))
        assert res.ok and runner._server is not None and runner.fork_server  # still forking
        assert len(said) == 1 and "without the modules it preloads (ts_thread_mod)" in said[0] and "threads" in said[0]
    finally:
        runner.close()


@pytest.mark.skipif(not forkserver.available(), reason="fork servers need Linux")
def test_modules_known_after_a_trial_are_imported_by_the_running_server(tmp_path, monkeypatch):
    """A script's libraries, known from its baseline trial (ScriptRunner), go to the server that
    is running, between trials: no second server start. One that starts a thread at import
    ends that server; the next trial gets one with the earlier list, and says why."""
    marker = tmp_path / "imported_by.txt"
    _module(tmp_path, "ts_late_mod", f"import os\nopen({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n",
            monkeypatch)
    _module(tmp_path, "ts_late_thread", "import threading, time\n"
            "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n", monkeypatch)
    base = tmp_path / "base.yaml"
    base.write_text(TINY_GPT)
    said = []
    runner = SubprocessRunner(base_config=base, out_dir=tmp_path / "trials", timeout_s=120, say=said.append)
    try:
        assert runner(TrialRequest(key="b", label="baseline", overrides=(), repeat=0)).ok
        server = runner._server
        runner.preload_more(["ts_late_mod", "torch", "ts_late_mod"])  # torch: the server's own already
        assert runner._server is server and runner.preload == ("ts_late_mod",)
        assert marker.read_text().split() == [str(server._proc.pid)]
        assert runner(TrialRequest(key="b", label="baseline", overrides=(), repeat=1)).ok
        assert marker.read_text().split() == [str(server._proc.pid)]  # the trial did not import it again
        runner.preload_more(["ts_late_thread"])
        assert runner._server is None and runner.preload == ("ts_late_mod",) and runner.fork_server
        assert len(said) == 1 and "without the script's libraries" in said[0] and "threads" in said[0]
        assert runner(TrialRequest(key="b", label="baseline", overrides=(), repeat=2)).ok
        assert runner._server is not None and runner._server is not server
    finally:
        runner.close()


def test_probing_the_recipe_lists_the_modules_its_build_imported(tmp_path, monkeypatch):
    import torch  # noqa: F401 - loaded before the probe, so not one of its modules

    from trainspeed.recipes import register_recipe, registry
    from trainspeed.tune.session import probe_recipe

    (tmp_path / "ts_probe_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_RECIPES", dict(registry._RECIPES))
    monkeypatch.setattr(registry, "_LOADED", dict(registry._LOADED))

    class Probe:
        name, description = "ts-probe", "imports a module, then fails to build"

        def build(self, config):
            import ts_probe_mod  # noqa: F401
            raise RuntimeError("no model here")

        def config_path(self, variant):
            return tmp_path / f"{variant}.yaml"

    register_recipe("ts-probe", Probe())
    try:
        facts = probe_recipe(load_config({"recipe": {"name": "ts-probe"}}))
        # Even a build that fails leaves what it imported; modules loaded before are not listed.
        assert "ts_probe_mod" in facts.modules and "torch" not in facts.modules
    finally:
        sys.modules.pop("ts_probe_mod", None)


def test_a_trial_reads_other_processes_cpu_from_its_sampler(tmp_path):
    """others_load: the sampler's other-process CPU over the measured steps, in cores."""
    import time

    from trainspeed.telemetry.monitor import Monitor
    from trainspeed.tune.trials import TrialRequest, result_from_run_dir

    mon = Monitor(tmp_path / "run", log_every=5, warmup_steps=1, system_sampler=True, kind="doctor",
                  write_env=False)
    for _ in range(8):
        time.sleep(0.1)  # 0.8 s: the doctor's sampler (every 0.25 s) takes readings inside the steps
        mon.step(samples=4)
    mon.close()
    result = result_from_run_dir(TrialRequest(key="k", label="baseline", overrides=(), repeat=0),
                                 tmp_path / "run", wall_s=1.0)
    assert result.ok and isinstance(result.others_load, float) and 0.0 <= result.others_load <= 64


def test_a_one_time_cost_in_the_first_of_three_measured_steps_is_warm_up():
    """chargpt at --budget 10m: trials cut to 1 warm-up + 3 measured steps, and its iteration-0
    sample and checkpoint (the step after the first) measured as a 59 s step beside 1.0-1.2 s
    ones: the settling rule judged only trials of 4 steps or more."""
    from trainspeed.tune.settle import settled_from

    assert settled_from([59.2, 1.24, 1.02]) == 1
    assert settled_from([2.0, 1.2, 1.0]) == 0  # a busy machine's 1.8x: still a step
    assert settled_from([59.2, 1.24]) == 0  # too few to judge
