"""A finding's `verify` command must run as written for the user: their script, their flags."""

from __future__ import annotations

import shlex
import sys

import pytest

from trainspeed.doctor.runner import DoctorConfig, run_doctor

pytestmark = pytest.mark.timeout(120)

SCRIPT = '''
import argparse, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=0.1)
args = p.parse_args()


class Slow(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(8), i % 2


loader = DataLoader(Slow(), batch_size=4)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


def test_script_findings_verify_with_the_script_tune_of_the_recorded_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    command = ["python", "train.py", "--lr", "0.05"]
    result = run_doctor(DoctorConfig(command=command, steps=12, out=tmp_path / "run", system_sampler=False))
    data = next(f for f in result.findings if f["id"].startswith("data"))
    assert data["verify_with"] == "trainspeed tune --knobs num_workers -- python train.py --lr 0.05"
    # what the CLI will do with it: a script tune of exactly that command
    from trainspeed.cli.main import build_parser
    from trainspeed.cli.tune import is_script_command

    args = build_parser().parse_args(shlex.split(data["verify_with"])[1:])
    assert is_script_command(args.target) and [args.target, *args.rest] == command and args.knobs == "num_workers"
    for finding in result.findings:
        assert "<your command>" not in (finding.get("verify_with") or "")
        assert "CONFIG.yaml" not in (finding.get("verify_with") or "")
    # the doctor saw where the loader, the optimizer and the model call are, and the flags
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert '"site":"train.py:21"' in events and '"site":"train.py:23"' in events
    assert '"call_site":"train.py:25"' in events and '"option":"--lr"' in events
    assert sys.argv[0] != "train.py"  # the script's argv was restored


def _ctx(step_s: float, start_s: float = 0.6):
    from pathlib import Path

    from trainspeed.doctor.checks.context import CheckContext
    from trainspeed.telemetry.rundir import RunData

    t0 = 1_000.0
    steps = [{"step": i + 1, "t_step": step_s, "t_wall": t0 + start_s + (i + 1) * step_s} for i in range(8)]
    run = RunData(path=Path("runs/doctor-train"), config={"command": ["python", "train.py", "--steps", "8"]},
                  steps=steps, events=[{"type": "run_start", "step": 0, "t_wall": t0, "data": {}}])
    return CheckContext.from_run(run, {"step_time": {"p50": step_s}})


def test_a_tune_command_for_slow_steps_asks_for_the_budget_that_measures_its_knobs():
    """time_sequence_prediction (LBFGS, 35 s steps) was told `trainspeed tune --knobs compile -- ...`:
    the 10-minute default measured nothing and said so after 6.5 minutes. The command asks for
    the budget its knobs need at the run's step time, and the same command for fast steps."""
    from trainspeed.tune.trial_fit import budget_to_measure

    assert _ctx(0.05).tune_command("compile") == "trainspeed tune --knobs compile -- python train.py --steps 8"
    slow = _ctx(31.8)
    assert slow._start_s() == pytest.approx(0.6)
    # the first trial (2 warm-up + 3 steps), then trials of 1 warm-up + 3 steps: 2 rounds of 2 baselines
    # and the compile setting at 3x, 3 verification rounds of 2: 16 trials
    assert budget_to_measure(31.8, 0.6, [3.0]) == pytest.approx(0.6 + 5 * 31.8 + 16 * (0.6 + 4 * 31.8))
    # every trial's warm-up step pays the one-time costs the run's first step paid (nanoGPT: 24 s
    # beside 10 s steps)
    assert budget_to_measure(31.8, 0.6, [3.0], first_step_s=44.0) == pytest.approx(
        0.6 + 44.0 + 4 * 31.8 + 16 * (0.6 + 44.0 + 3 * 31.8))
    # --from: the tune takes this run's FLOP count instead of counting a slow step again
    assert slow.tune_command("compile") == ("trainspeed tune --knobs compile --budget 45m --from runs/doctor-train "
                                            "-- python train.py --steps 8")
    assert slow.tune_command("precision", "compile") == ("trainspeed tune --knobs precision,compile --budget 50m "
                                                         "--from runs/doctor-train -- python train.py --steps 8")
    # steps of 2 s fit a compile tune in the default 10 minutes: nothing added
    assert " --budget" not in _ctx(2.0).tune_command("compile")
    assert " --budget" not in _ctx(7.0).tune_command("compile")  # 9.9 minutes
    assert " --budget 15m --from runs/doctor-train -- " in _ctx(10.0).tune_command("compile")


def test_a_run_with_a_tunes_settings_verifies_with_those_settings(tmp_path, monkeypatch, capsys):
    """The demo's "after" run (`trainspeed run --with tune/best.yaml --doctor -- python train.py`,
    num_workers=2 applied) printed `trainspeed tune --knobs persistent_workers -- python train.py`:
    on the script as it is (no workers) the tune could measure nothing ("needs num_workers > 0",
    exit 3). Its tunes now measure the applied settings too, and its reruns apply them again."""
    from trainspeed.cli.main import build_parser, main

    monkeypatch.chdir(tmp_path)
    head, loop = SCRIPT.split("for x, y in loader:")
    # three epochs: each starts the workers again (the persistent_workers finding)
    (tmp_path / "train.py").write_text(head + "for epoch in range(3):\n  for x, y in loader:" + loop.replace("\n    ", "\n      "))
    (tmp_path / "best.yaml").write_text("schema: 1\nkind: script-settings\ncommand: [python, train.py]\n"
                                        "settings:\n  loader.num_workers: 1\n")
    rc = main(["run", "--with", "best.yaml", "--doctor", "--quiet", "--steps", "300", "--out", "after",
               "--", "python", "train.py", "--lr", "0.05"])
    assert rc == 0
    import json

    report = json.loads((tmp_path / "after" / "report.json").read_text())
    commands = [f["verify_with"] for f in report["findings"] if f.get("verify_with")]
    assert any("persistent_workers" in c for c in commands), commands
    for c in commands:
        words = shlex.split(c.removesuffix(" (on a quiet machine)").removesuffix(" (after the change)"))
        if words[1] == "tune":
            knobs = words[words.index("--knobs") + 1].split(",")
            assert knobs[0] == "num_workers" and words[words.index("--") + 1:] == ["python", "train.py", "--lr", "0.05"]
            args = build_parser().parse_args(words[1:])
            assert args.knobs == ",".join(knobs)
        else:
            assert words[:5] == ["trainspeed", "run", "--with", "best.yaml", "--doctor"], c
            assert "--steps" in words and build_parser().parse_args(words[1:]).steps == 300


def _eval_run(flags):
    """A script run that evaluates every 13 steps, 20 % of the time, with the script's flags."""
    from pathlib import Path

    from test_checks import make_event, make_run
    from trainspeed.doctor.checks.context import CheckContext
    from trainspeed.telemetry.rundir import RunData
    from trainspeed.telemetry.summary import summarize

    run = make_run(n=52, shares={"forward": 0.3, "backward": 0.5})
    for i, step in enumerate(run.steps):
        step["phases"]["eval"] = 0.03 if i % 13 == 12 else 0.0
    obs = [make_event("observation", 0, 0.0, kind="script_flags", source="argparse", site="main.py:13", flags=flags)]
    run = RunData(path=Path("runs/doctor-main"), config={"command": ["python", "main.py", "--nEpochs", "4"]},
                  steps=run.steps, events=[*run.events, *obs])
    return CheckContext.from_run(run, summarize(run))


def test_an_evaluation_without_an_interval_flag_is_verified_by_the_doctor_not_a_tune_that_skips_it():
    """pytorch/examples' super_resolution runs test() after every epoch and has no flag for it: its
    evaluation finding said `verify: trainspeed tune --knobs eval_every -- python main.py ...`, and
    that tune, run as written, measured nothing ("the script has no eval-interval flag")."""
    from trainspeed.doctor.checks import loop

    epochs = {"option": "--nEpochs", "dest": "nEpochs", "value": 4, "default": 2, "type": "int", "kind": "store"}
    f = loop.evaluation_share(_eval_run([epochs]))
    assert f is not None and "every 13 steps" in f.evidence
    assert "--knobs eval_every" not in f.verify_with
    assert f.verify_with.startswith("trainspeed doctor") and "(after the change)" in f.verify_with
    interval = {"option": "--eval-interval", "dest": "eval_interval", "value": 13, "default": 13, "type": "int",
                "kind": "store"}
    f = loop.evaluation_share(_eval_run([epochs, interval]))
    assert f.verify_with == "trainspeed tune --knobs eval_every -- python main.py --nEpochs 4"


def test_an_evaluation_after_every_epoch_is_advised_in_epochs():
    """super_resolution's test() after each 13-step epoch was told 'evaluate less often than every
    13 steps (every 500)': past its whole run (2 epochs by default)."""
    from trainspeed.doctor.checks.script_flags import evaluation_advice

    ctx = _eval_run([])
    loader = {"kind": "dataloader", "role": "train", "num_workers": 4, "batch_size": 16, "dataset_len": 200,
              "drop_last": False, "cores": 2}
    ctx.observations.setdefault("dataloader", []).append(loader)
    _, advice = evaluation_advice(ctx)
    assert "every few epochs instead of after each one (an epoch is 13 steps here" in advice
    assert "every 500" not in advice and "eval.every_steps=52" in advice
    ctx.observations["dataloader"][0] = {**loader, "dataset_len": 2000}  # an epoch of 125 steps: not per epoch
    assert "every 500" in evaluation_advice(ctx)[1]
