"""`trainspeed doctor/tune/run -- accelerate launch ...` on a small Accelerate script, on 1 and 2
CPU processes (issue #30: the launcher users already use was refused as a script path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytestmark = pytest.mark.timeout(300)  # a few seconds of CPU each; accelerate starts fresh processes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "assets" / "scripts" / "accelerate_train.py"


def trainspeed(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRAINSPEED_CACHE": str(cwd / "cache"),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.run([sys.executable, "-m", "trainspeed", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=280)


def test_parse_reads_accelerates_own_options():
    from trainspeed.cli._launchers import parse_accelerate

    launch = parse_accelerate(["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "train.py", "--lr", "1"])
    assert launch.options == ["--multi_gpu", "--num_processes", "2"] and launch.processes == 2
    assert launch.command == ["python", "train.py", "--lr", "1"]
    module = parse_accelerate(["accelerate", "launch", "-m", "pkg.train", "--steps", "3"])
    assert module.command == ["python", "-m", "pkg.train", "--steps", "3"] and module.processes == 1
    assert module.env.get("ACCELERATE_USE_CPU") is not None  # what the one-process launcher sets


def test_verify_commands_keep_the_accelerate_launch_prefix_as_typed(tmp_path):
    # the doctor in each process recorded `python train.py ARGS` only: its verify commands read
    # `trainspeed doctor -- python train.py ...`, the launcher the user typed dropped
    from types import SimpleNamespace

    from trainspeed.doctor.checks.context import CheckContext

    launcher = ["accelerate", "launch", "--mixed_precision", "no", "--num_processes", "2"]
    run = SimpleNamespace(path=tmp_path / "doc", config={"command": ["python", "train.py", "--print-freq", "1"],
                                                          "launcher": launcher})
    ctx = CheckContext(run=run, summary={"ranks": [{"rank": 0}, {"rank": 1}]})
    assert ctx.doctor_command(steps=40, flags=["--print-freq 50"]) == (
        "trainspeed doctor --steps 40 -- accelerate launch --mixed_precision no --num_processes 2 "
        "train.py --print-freq 50")
    # a tune's trials are one process each: the launcher's one-process form (what tune asks for),
    # its other options kept (the precision was dropped: a bf16 run's tune measured fp32)
    assert ctx.tune_command("threads") == ("trainspeed tune --knobs threads -- accelerate launch "
                                           "--num_processes 1 --mixed_precision no train.py --print-freq 1")
    ctx.summary["ranks"] = []
    run.config["launcher"] = ["accelerate", "launch", "--num_processes", "1"]
    run.config["command"] = ["python", "-m", "pkg.train", "--lr", "1"]
    assert ctx.tune_command("threads") == ("trainspeed tune --knobs threads -- accelerate launch "
                                           "--num_processes 1 -m pkg.train --lr 1")


@pytest.mark.slow  # 10-40 s: started first under xdist (tests/conftest.py)
@pytest.mark.parametrize("processes", [1, 2])
def test_doctor_under_accelerate_launch(tmp_path, processes):
    launch = ["--num_processes", "1"] if processes == 1 else ["--multi_gpu", "--num_processes", "2"]
    res = trainspeed("doctor", "--steps", "12", "--out", str(tmp_path / "r"), "--no-html", "--",
                     "accelerate", "launch", *launch, str(SCRIPT), "--steps", "200", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["doctor"]["steps"] == 12
    ranks = report["summary"].get("ranks") or []
    assert len(ranks) == (processes if processes > 1 else 0), ranks
    assert "stopped after 12 steps" in res.stdout and res.stdout.count("trainspeed doctor: stopped") == 1
    # the launcher as typed is recorded, and every verify command of a script runs under it
    import yaml

    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["launcher"] == ["accelerate", "launch", *launch]
    commands = [f["verify_with"] for f in report["findings"] if " -- " in str(f.get("verify_with"))]
    assert all(" -- accelerate launch " in c for c in commands), commands


def test_the_one_process_form_keeps_every_other_option():
    from trainspeed.doctor.command_words import one_process_launch

    assert one_process_launch(["accelerate", "launch", "--multi_gpu", "--num_processes=4", "--mixed_precision",
                               "bf16", "--config_file", "c.yaml"]) == [
        "accelerate", "launch", "--num_processes", "1", "--mixed_precision", "bf16", "--config_file", "c.yaml"]
    assert one_process_launch(["accelerate", "launch", "--num_processes", "2", "--cpu"]) == [
        "accelerate", "launch", "--num_processes", "1", "--cpu"]


def test_processes_are_the_ones_accelerate_starts():
    # transformers' run_clm_no_trainer.py under `accelerate launch --num_processes 2 --cpu`: accelerate's
    # simple launcher ran one process ("Num processes: 1"); the doctor said "under accelerate (2
    # processes)" and its tune command, with the 2 kept, was refused by the tune
    pytest.importorskip("accelerate")
    from trainspeed.cli._launchers import parse_accelerate

    cpu = parse_accelerate(["accelerate", "launch", "--num_processes", "2", "--cpu", "train.py"])
    assert cpu.processes == 1 and cpu.env.get("ACCELERATE_USE_CPU") is not None
    assert parse_accelerate(["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "train.py"]).processes == 2


def test_tune_takes_a_one_process_launch_and_refuses_two(tmp_path, capsys):
    from trainspeed.cli.main import main  # the refusal in this process: no second interpreter to start

    assert main(["tune", "--knobs", "threads", "--", "accelerate", "launch", "--multi_gpu", "--num_processes",
                 "2", str(SCRIPT)]) == 2
    two = capsys.readouterr().err
    assert "tune one process of it" in two and "--num_processes 1" in two
    out = tmp_path / "t"
    one = trainspeed("tune", "--knobs", "threads", "--steps", "4", "--warmup-steps", "1", "--repeats", "1",
                     "--max-rounds", "1", "--verify-repeats", "0", "--budget", "4m", "--out", str(out), "--",
                     "accelerate", "launch", "--num_processes", "1", str(SCRIPT), "--steps", "400", cwd=tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    data = json.loads((out / "tune.json").read_text())
    assert data["trials_run"] >= 1 and any(r["knob"] == "threads" for r in data["ablation"])
    assert "accelerate launch --num_processes 1" in one.stdout  # the next command keeps the launcher
