"""`trainspeed doctor -- torchrun|deepspeed OPTIONS train.py ARGS`: read by the launcher's own
parser, then the doctor goes in under the launcher (end to end: torchrun in
tests/distributed/test_doctor_ranks.py, deepspeed in tests/doctor/test_deepspeed_script.py)."""

from __future__ import annotations

import sys

import pytest

from trainspeed.doctor.launch_forms import is_rank_launcher, is_torchrun, parse_rank_launch
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(60)


def test_the_launcher_words_script_and_its_args_are_told_apart():
    launch = parse_rank_launch(["torchrun", "--standalone", "--nproc_per_node", "2", "train.py",
                             "config/train_shakespeare_char.py", "--device=cpu", "--nproc_per_node", "9"])
    assert launch.command == ["python", "train.py", "config/train_shakespeare_char.py", "--device=cpu",
                              "--nproc_per_node", "9"]  # the script's own args stay its own
    assert launch.options == ["--standalone", "--nproc_per_node", "2"] and launch.processes == "2"
    assert launch.launcher == ["torchrun", "--standalone", "--nproc_per_node", "2"]
    module = parse_rank_launch([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "-m",
                             "pkg.train", "--lr", "1"])
    assert module.command == ["python", "-m", "pkg.train", "--lr", "1"] and module.options == ["--nproc-per-node=2"]
    assert module.launcher == [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]


def test_only_torchrun_is_taken_and_a_script_is_needed():
    assert is_torchrun(["/usr/bin/torchrun", "t.py"]) and is_torchrun(["python3", "-m", "torch.distributed.run", "t.py"])
    assert not is_torchrun(["python", "train.py"]) and not is_rank_launcher(["accelerate", "launch", "t.py"])
    assert is_rank_launcher(["deepspeed", "t.py"]) and not is_torchrun(["deepspeed", "t.py"])
    with pytest.raises(ConfigError, match="leave --no-python out"):
        parse_rank_launch(["torchrun", "--no-python", "nvidia-smi"])


def test_tune_refuses_torchrun_with_the_one_process_command(capsys):
    # the module form used to come back as `trainspeed tune -- python --nproc_per_node 2 -m ...`
    from trainspeed.cli.main import main

    assert main(["tune", "--knobs", "threads", "--", "torchrun", "--nproc_per_node", "2", "-m", "pkg.train",
                 "--lr", "1"]) == 2
    assert "tune one process of it: trainspeed tune -- python -m pkg.train --lr 1" in capsys.readouterr().err
    assert main(["tune", "--knobs", "threads", "--", "torchrun", "--standalone", "--nproc_per_node", "2",
                 "train.py", "--lr", "1"]) == 2
    assert "trainspeed tune -- python train.py --lr 1" in capsys.readouterr().err


def test_run_with_goes_in_under_torchrun_with_its_own_options(tmp_path, monkeypatch):
    # `trainspeed run --with best.yaml -- torchrun ...` was refused ("one process per rank")
    import trainspeed.cli._rank_launch as rank_launch
    from trainspeed.cli.main import main

    (tmp_path / "best.yaml").write_text("schema: 1\nkind: script-settings\ncommand: [python, t.py]\n"
                                        "settings:\n  threads: 1\n")
    seen = {}
    monkeypatch.setattr(rank_launch, "relaunch_ranks", lambda launch, own: seen.update(launch=launch, own=own) or 0)
    assert main(["run", "--with", str(tmp_path / "best.yaml"), "--doctor", "--steps", "5", "--",
                 "torchrun", "--nproc_per_node", "2", "t.py", "--lr", "1"]) == 0
    assert seen["launch"].command == ["python", "t.py", "--lr", "1"]
    assert seen["own"] == ["run", "--with", str(tmp_path / "best.yaml"), "--doctor", "--steps", "5"]


def test_deepspeeds_launcher_is_read_by_its_own_parser(monkeypatch):
    pytest.importorskip("deepspeed")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    launch = parse_rank_launch(["deepspeed", "--num_gpus", "2", "train.py", "--deepspeed_config", "ds.json"])
    assert (launch.kind, launch.processes) == ("deepspeed", "2")
    assert launch.command == ["python", "train.py", "--deepspeed_config", "ds.json"]
    assert launch.options == ["--num_gpus", "2"] and launch.launcher == ["deepspeed", "--num_gpus", "2"]
