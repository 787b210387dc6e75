"""Findings are a function of the run directory: a Monitor loop's report.json carries them
(written at close), `trainspeed report` computes them for a run that has none, and the
layering holds (telemetry and the engine do not import the doctor until a run ends)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainspeed.cli.main import main
from trainspeed.telemetry import diagnosis
from trainspeed.telemetry.monitor import Monitor

pytestmark = pytest.mark.timeout(240)

SCRIPT = Path(__file__).resolve().parents[1] / "assets" / "scripts" / "monitor_slow_data.py"
ROOT = Path(__file__).resolve().parents[2]


def _report(run_dir: Path) -> dict:
    return json.loads((run_dir / "report.json").read_text())


def _slow_loop(mon: Monitor, steps: int, wait_s: float = 0.004) -> None:
    """A loop whose batches take `wait_s` to build (a generator: no DataLoader)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def batches():
        for _ in range(steps):
            time.sleep(wait_s)
            yield torch.randn(8, 16), torch.randn(8, 1)

    for x, y in mon.loader(batches()):
        with mon.phase("forward"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        with mon.phase("backward"):
            loss.backward()
        with mon.phase("optimizer"):
            opt.step()
            opt.zero_grad()
        mon.step(samples=8, loss=loss)


@pytest.fixture(scope="module")
def script_run(shared_dir, built_once):
    """The README's Monitor loop, run as the user runs it: `python monitor_slow_data.py RUN`
    (once per session: built_once, tests/conftest.py)."""

    def build() -> Path:
        cwd = shared_dir / "monitor-script"
        cwd.mkdir(exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        done = subprocess.run([sys.executable, str(SCRIPT), str(cwd / "run"), "100"], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        (cwd / "stdout.txt").write_text(done.stdout)
        return cwd

    cwd = built_once("monitor-script", build)
    return cwd / "run", (cwd / "stdout.txt").read_text()


def test_monitor_loop_gets_data_bound_in_report_json(script_run):
    run, _ = script_run
    report = _report(run)
    assert report["diagnosis"]["by"] == "Monitor.close"
    assert report["diagnosis"]["findings"] == len(report["findings"])
    first = report["findings"][0]
    assert first["id"] == "data_bound" and first["severity"] == "critical"
    assert first["impact"] >= 0.30  # ~4 ms of sleep per batch vs well under 1 ms of compute
    # the loader handed to mon.loader() is recorded: the finding names its settings
    assert "num_workers=0" in first["evidence"] and "(no DataLoader)" not in first["evidence"]


def test_monitor_loop_verify_command_reruns_the_script(script_run):
    run, _ = script_run
    verify = _report(run)["findings"][0]["verify_with"]
    # the script tuner on the user's own command: no config is claimed
    assert verify.startswith("trainspeed tune --knobs num_workers -- ")
    assert verify.endswith(f"{SCRIPT} {run} 100")
    assert "CONFIG" not in verify and "config.yaml" not in verify


def test_monitor_close_overhead_is_small(script_run):
    _, out = script_run
    close_s = float(out.split("close_s=")[1].split()[0])
    # flush + summary + diagnosis of 100 steps (the rules' import included, ~40 ms), less the time
    # close sat waiting for a core: 1.39 s of wall time at load 16 on 2 cores
    assert close_s < 1.0, out


def test_report_cli_shows_the_finding(script_run, capsys):
    run, _ = script_run
    assert main(["report", str(run), "--no-html"]) == 0
    out = capsys.readouterr().out
    assert "data-bound" in out and "Findings: none" not in out


def test_report_diagnoses_a_run_written_without_findings(script_run, tmp_path, capsys):
    """report.json as a Monitor wrote it before findings were computed at close: `[]`."""
    run = tmp_path / "old"
    run.mkdir()
    for name in ("steps.jsonl", "events.jsonl", "env.json"):
        (run / name).write_bytes((script_run[0] / name).read_bytes())
    old = _report(script_run[0])
    old["findings"] = []
    del old["diagnosis"]
    (run / "report.json").write_text(json.dumps(old))
    assert not diagnosis.has_diagnosis(old)

    assert main(["report", str(run), "--no-html"]) == 0
    assert "data-bound" in capsys.readouterr().out
    stored = _report(run)
    assert stored["findings"][0]["id"] == "data_bound"
    assert stored["diagnosis"]["by"] == "trainspeed report"
    assert stored["summary"] == old["summary"]  # the rest of report.json is kept


def test_stored_findings_win_until_rediagnose(script_run, tmp_path, capsys):
    run = tmp_path / "kept"
    run.mkdir()
    for name in ("steps.jsonl", "events.jsonl", "env.json", "report.json"):
        (run / name).write_bytes((script_run[0] / name).read_bytes())
    report = _report(run)
    report["findings"] = [{"id": "planted", "severity": "info", "title": "a planted finding",
                           "evidence": "e", "recommendation": "r", "verify_with": None, "impact": 0.0}]
    report["time_goes"] = {"statement": "a planted statement", "helps": ["nothing"]}
    (run / "report.json").write_text(json.dumps(report))
    assert main(["report", str(run), "--no-html"]) == 0
    assert "a planted finding" in capsys.readouterr().out
    assert main(["report", str(run), "--no-html", "--rediagnose"]) == 0
    out = capsys.readouterr().out
    assert "a planted finding" not in out and "data-bound" in out
    # the top statement comes from the same rules: recomputed with the findings, not kept
    assert "a planted statement" not in out and "Where the time goes: data-bound" in out
    assert _report(run)["findings"][0]["id"] == "data_bound"


def test_monitor_without_a_script_claims_no_config(tmp_path):
    """In-process (here under pytest, as in a notebook): no script to re-run, no config."""
    mon = Monitor(tmp_path / "run", log_every=10, warmup_steps=1, system_sampler=False)
    _slow_loop(mon, 30)
    mon.close()
    finding = _report(tmp_path / "run")["findings"][0]
    assert finding["id"] == "data_bound"
    assert "(no DataLoader)" in finding["evidence"]  # a generator, not a DataLoader
    assert finding["verify_with"] == f"trainspeed report {tmp_path / 'run'} --compare NEW_RUN_DIR (after the change)"


def test_findings_given_to_close_are_stored_as_given(tmp_path):
    mon = Monitor(tmp_path / "run", log_every=10, warmup_steps=1, system_sampler=False)
    _slow_loop(mon, 5, wait_s=0.0)
    given = [{"id": "mine", "severity": "info", "title": "t", "evidence": "e", "recommendation": "r",
              "verify_with": None, "impact": 0.0}]
    mon.close(findings=given)
    report = _report(tmp_path / "run")
    assert report["findings"] == given and report["diagnosis"]["by"] == "given"


def test_doctor_kind_leaves_findings_to_the_doctor(tmp_path):
    mon = Monitor(tmp_path / "run", log_every=10, warmup_steps=1, system_sampler=False, kind="doctor")
    _slow_loop(mon, 20)
    mon.close()
    report = _report(tmp_path / "run")
    assert report["findings"] == [] and "diagnosis" not in report


def test_a_failing_diagnoser_never_fails_the_run(tmp_path):
    def broken(run, summary):
        raise RuntimeError("rule exploded")

    previous = diagnosis.set_diagnoser(broken)
    try:
        mon = Monitor(tmp_path / "run", log_every=10, warmup_steps=1, system_sampler=False)
        _slow_loop(mon, 5, wait_s=0.0)
        summary = mon.close()
    finally:
        diagnosis.set_diagnoser(previous)
    assert summary["steps"] == 5
    (finding,) = _report(tmp_path / "run")["findings"]
    assert finding["id"] == "check_error.diagnose" and "rule exploded" in finding["evidence"]


def test_diagnosis_of_100_steps_is_a_fraction_of_a_second(tmp_path):
    mon = Monitor(tmp_path / "run", log_every=25, warmup_steps=2, system_sampler=False)
    _slow_loop(mon, 100, wait_s=0.0)
    mon.close()
    from trainspeed.telemetry.rundir import read_run

    run = read_run(tmp_path / "run")
    diagnosis.diagnose_run(run)  # the rules' import, once per process
    t0 = time.process_time()  # CPU time: a busy machine stretches the wall clock, not the work
    diagnosis.diagnose_run(run, _report(tmp_path / "run")["summary"])
    assert time.process_time() - t0 < 0.5


def test_telemetry_and_engine_do_not_import_the_doctor():
    code = ("import sys, trainspeed.telemetry.monitor, trainspeed.engine.trainer, trainspeed.telemetry.diagnosis; "
            "print(sorted(m for m in sys.modules if m.startswith('trainspeed.doctor')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
