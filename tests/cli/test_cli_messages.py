"""Every message of the command line says what is wrong and how to write it (issue #30, #31)."""

from __future__ import annotations

import pytest

from trainspeed.cli.main import main


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors exit
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_subcommand_option_typo_gets_did_you_mean_from_that_subcommand(capsys):
    code, out, err = _run(["doctor", "--stpes", "5", "--", "python", "train.py"], capsys)
    assert code == 2
    assert "usage: trainspeed doctor" in err and "did you mean --steps?" in err
    code, _, err = _run(["tune", "--bugdet", "5m", "--", "python", "train.py"], capsys)
    assert code == 2 and "did you mean --budget?" in err


def test_trainspeed_options_after_the_script_without_dashes_are_refused_with_both_forms(capsys, tmp_path,
                                                                                      monkeypatch):
    """`trainspeed doctor python main.py --steps 10` ran the default 200 steps and handed --steps
    10 to main.py, which ignored it; `tune python main.py --budget 1m` tuned for 10 minutes."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "main.py").write_text("print('ran')\n")
    code, _, err = _run(["doctor", "python", "main.py", "--steps", "10"], capsys)
    assert code == 2 and "--steps follows the script's command with no `--`" in err
    assert "For trainspeed: trainspeed doctor --steps 10 -- python main.py;" in err
    assert "if it is the script's own option: trainspeed doctor -- python main.py --steps 10" in err
    code, _, err = _run(["tune", "python", "main.py", "--budget=1m"], capsys)
    assert code == 2 and "trainspeed tune --budget=1m -- python main.py" in err
    code, _, err = _run(["run", "--with", "best.yaml", "python", "main.py", "--out", "x"], capsys)
    assert code == 2 and "--out follows" in err
    assert not (tmp_path / "runs").exists()  # refused before anything ran
    # with `--` the split is the user's: the script gets --steps (it runs and ignores it)
    code, out, _ = _run(["doctor", "--out", str(tmp_path / "r"), "--", "python", "main.py", "--steps", "10"], capsys)
    assert "follows the script's command" not in out and (tmp_path / "r").exists()


def test_a_subcommand_without_its_required_argument_says_what_is_missing(capsys):
    code, out, err = _run(["doctor"], capsys)
    assert code == 2 and "no command given" in err and "trainspeed doctor -- python train.py" in err
    assert "COMMAND ..." not in out  # not the top-level help
    code, _, err = _run(["train"], capsys)
    assert code == 2 and "required: target" in err and "rest" not in err.split("required:")[1]
    code, _, err = _run(["run"], capsys)
    assert code == 2 and "required: --with" in err


@pytest.mark.parametrize("budget", ["10", "2.5"])
def test_a_duration_needs_its_unit(capsys, budget):
    code, _, err = _run(["tune", "--budget", budget, "--", "python", "train.py"], capsys)
    assert code == 2 and f"'{budget}' has no unit; write {budget}s, {budget}m or {budget}h" in err
    # after the target too (options parsed out of the overrides)
    code, _, err = _run(["tune", "gpt", "data.batch_size=4", "--budget", budget], capsys)
    assert code == 2 and "usage: trainspeed tune" in err and "has no unit" in err


def test_train_and_tune_help_list_their_options(capsys):
    code, out, _ = _run(["train", "--help"], capsys)
    assert code == 0
    for option in ("--naive", "--variant", "--resume PATH", "--auto-resume", "--name", "--no-report", "--print-config"):
        assert option in out, option
    code, out, _ = _run(["tune", "--help"], capsys)
    assert code == 0 and "--budget" in out and "--print-config" in out


def test_train_options_before_or_after_the_target(capsys):
    code, after, _ = _run(["train", "gpt", "--naive", "--print-config", "--name=x1", "run.max_steps=7"], capsys)
    assert code == 0
    code, before, _ = _run(["train", "--naive", "--name", "x1", "gpt", "--print-config", "run.max_steps=7"], capsys)
    assert code == 0 and before == after
    assert "max_steps: 7" in after and "name: x1" in after
    code, fast, _ = _run(["train", "gpt", "--print-config"], capsys)
    assert fast != after  # --naive was read, not taken for an override


def test_help_knobs_prints_whole_sentences(capsys):
    from trainspeed.tune.script_knobs import SCRIPT_KNOBS

    code, out, _ = _run(["tune", "--help-knobs"], capsys)
    assert code == 0
    text = " ".join(out.split())
    for name, fn in SCRIPT_KNOBS.items():
        doc = " ".join((fn.__doc__ or "").split())
        assert doc and doc in text, name


def test_an_interrupted_tune_prints_the_command_that_resumes_it(tmp_path, monkeypatch, capsys):
    import trainspeed.tune.script_session as script_session

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.setattr(script_session, "run_script_tune", interrupted)
    code, _, err = _run(["tune", "--knobs", "threads", "--budget", "2m", "--", "python", "train.py", "--lr", "1"],
                        capsys)
    assert code == 130
    # the command whole, on a line of its own (copied as it is); the sentence before it folds as
    # every progress line does, at the log's width
    assert ("Resume with:\n    trainspeed tune --out runs/tune-train-threads --knobs threads --budget 2m -- python "
            "train.py --lr 1\n") in err
    assert all(len(line) <= 110 for line in err.splitlines() if "trainspeed tune --out" not in line), err
    assert "Traceback" not in err


def test_a_tune_ended_by_sigterm_says_how_to_resume_and_leaves_the_handler_as_it_was(tmp_path, monkeypatch, capsys):
    """`timeout 10m trainspeed tune ...` (or a scheduler) sends SIGTERM: the tune ended without
    a word, its finished trials kept; it now says so and how to go on, as on Ctrl-C."""
    import os
    import signal

    import trainspeed.tune.script_session as script_session

    def terminated(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)  # delivered at the next bytecode of this thread
        raise AssertionError("SIGTERM was not turned into an interrupt")

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.setattr(script_session, "run_script_tune", terminated)
    before = signal.getsignal(signal.SIGTERM)
    code, _, err = _run(["tune", "--knobs", "threads", "--budget", "2m", "--", "python", "train.py"], capsys)
    # 128 + SIGTERM, as the shell reports a process the signal ended (it read 130, Ctrl-C's)
    assert code == 143 and "Resume with:\n    trainspeed tune --out runs/tune-train-threads" in err, err
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_negative_budget_or_floor_is_refused_with_what_is_wrong(tmp_path, monkeypatch, capsys):
    """`--budget -5m` answered "expected one argument"; `--min-effect -0.1` ran a whole tune."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    code, _, err = _run(["tune", "--budget", "-5m", "--", "python", "train.py"], capsys)
    assert code == 2 and "argument --budget: '-5m' is negative; a duration is positive" in err, err
    code, _, err = _run(["tune", "--min-effect", "-0.1", "--budget", "1m", "--", "python", "train.py"], capsys)
    assert code == 2 and "--min-effect must be in [0, 1)" in err and not (tmp_path / "runs").exists(), err
    # after `--`, the script's own flags are its own
    from trainspeed.cli.main import _joined_values

    assert _joined_values(["tune", "--budget", "-5m", "--", "python", "t.py", "--budget", "-1"]) == [
        "tune", "--budget=-5m", "--", "python", "t.py", "--budget", "-1"]
