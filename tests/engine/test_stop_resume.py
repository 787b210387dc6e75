"""Stops and resumes through the Trainer: the step a signal ends has its record, a resume after
it leaves no gap, the stop says where the checkpoint went and how to resume, Ctrl-C is an
interrupt (not a crash), every checkpoint unusable stops auto-resume with the choices, and a
resume of a path that does not exist writes no run directory."""

from __future__ import annotations

import os
import signal
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainspeed.engine.checkpoint.stop import resume_command
from trainspeed.engine.events import Callback
from trainspeed.engine.trainer import Trainer
from trainspeed.errors import CheckpointError, TrainspeedWarning
from trainspeed.telemetry import read_run

from engine_tiny import mse, tiny_data, tiny_model

pytestmark = pytest.mark.timeout(120)


class SignalAt(Callback):
    def __init__(self, step, sig):
        self.step, self.sig = step, sig

    def on_batch_end(self, state):
        if state.step == self.step:
            if signal.getsignal(self.sig) is signal.SIG_DFL:  # SIGHUP unhandled: it would end pytest
                raise AssertionError(f"{signal.Signals(self.sig).name} is not handled while training")
            os.kill(os.getpid(), self.sig)


def _cfg(tmp_path, **ckpt):
    return {"run": {"out_dir": str(tmp_path), "name": "r", "max_steps": 8, "seed": 3},
            "data": {"batch_size": 8},
            "logging": {"every": 1, "warmup_steps": 0, "progress": False},
            "eval": {"at_end": False}, "checkpoint": {"async_save": False, **ckpt}}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_stop_records_its_step_and_the_resume_has_no_gap(tmp_path, capsys, sig):
    expected = KeyboardInterrupt if sig == signal.SIGINT else SystemExit
    with pytest.raises(expected):
        Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path), callbacks=[SignalAt(5, sig)]).fit()
    run_dir = tmp_path / "r"
    ckpt = run_dir / "checkpoints" / "step-00000005.pt"
    assert ckpt.exists()
    line = [x for x in capsys.readouterr().err.splitlines() if "stopped at step" in x]
    assert line == [f"trainspeed: stopped at step 5; checkpoint saved to {ckpt}; resume with "
                    f"{resume_command(ckpt, 'r')}"]
    run = read_run(run_dir)
    assert [s["step"] for s in run.steps] == [1, 2, 3, 4, 5]  # the signal's step is recorded
    types = [e["type"] for e in run.events]
    assert "crash" not in types
    interrupt = next(e for e in run.events if e["type"] == "interrupt")
    assert interrupt["data"]["signal"] == signal.Signals(sig).name
    assert next(e for e in run.events if e["type"] == "run_end")["data"]["steps"] == 5

    Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, auto_resume=True)).fit()
    assert f"resumed from {ckpt} at step 5" in capsys.readouterr().err
    assert [s["step"] for s in read_run(run_dir).steps] == list(range(1, 9))


def test_resume_command_keeps_the_command_and_names_the_run():
    argv = ["/venv/bin/trainspeed", "train", "gpt", "run.max_steps=100", "--resume", "/x/step-1.pt"]
    assert resume_command("/p", "gpt-1", argv) == \
        "trainspeed train gpt run.max_steps=100 run.name=gpt-1 --auto-resume"
    argv = ["/src/trainspeed/__main__.py", "train", "my cfg.yaml", "--auto-resume", "--name", "old"]
    assert resume_command("/p", "old", argv) == "trainspeed train 'my cfg.yaml' run.name=old --auto-resume"
    assert resume_command("/p", "r", ["train.py"]).startswith("checkpoint.resume=/p")


def test_resume_command_under_torchrun_names_the_launcher(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    argv = ["/src/trainspeed/__main__.py", "train", "gpt", "distributed.strategy=fsdp"]
    assert resume_command("/p", "g", argv) == \
        "torchrun --nproc_per_node 2 -m trainspeed train gpt distributed.strategy=fsdp run.name=g --auto-resume"


def _corrupt_all(run_dir):
    for p in (run_dir / "checkpoints").glob("step-*.pt"):
        p.write_bytes(p.read_bytes()[:-7])


def test_every_checkpoint_damaged_stops_auto_resume_with_the_choices(tmp_path, recwarn):
    Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, every_steps=3)).fit()
    run_dir = tmp_path / "r"
    _corrupt_all(run_dir)
    before = (run_dir / "steps.jsonl").read_text()
    with pytest.raises(CheckpointError) as info:
        Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, every_steps=3, auto_resume=True)).fit()
    message = str(info.value)
    assert "every checkpoint" in message and "unusable" in message
    assert "run.name=NEW" in message and "--resume PATH" in message
    assert (run_dir / "steps.jsonl").read_text() == before  # nothing mixed into the old run
    assert all(issubclass(w.category, TrainspeedWarning) for w in recwarn
               if "corrupt" in str(w.message))


def test_a_missing_resume_file_is_an_error_before_any_run_directory(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, resume=str(tmp_path / "nope.pt")))
    assert not (tmp_path / "r").exists()


def test_trainspeed_warnings_are_one_line():
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        text = warnings.formatwarning("skipping corrupt checkpoint: x", TrainspeedWarning, "/a/manager.py", 397)
        other = warnings.formatwarning("m", UserWarning, "/a/b.py", 3)
    assert text == "trainspeed: warning: skipping corrupt checkpoint: x\n"
    assert "b.py:3: UserWarning: m" in other


def test_records_a_kill_lost_are_named_on_resume(tmp_path, capsys):
    """kill -9 after a checkpoint was published but before its steps' records were written:
    the resume cannot fill the gap, so it names it."""
    import json

    Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, every_steps=3)).fit()
    steps = tmp_path / "r" / "steps.jsonl"
    kept = [x for x in steps.read_text().splitlines() if json.loads(x)["step"] <= 4]
    steps.write_text("\n".join(kept) + "\n")
    (tmp_path / "r" / "checkpoints" / "step-00000008.pt").unlink()  # as if killed before step 8's save
    cfg = _cfg(tmp_path, every_steps=3, auto_resume=True)
    cfg["run"]["max_steps"] = 10
    Trainer(tiny_model(), mse, tiny_data(), config=cfg).fit()
    lost = [e["data"] for e in read_run(tmp_path / "r").events if e["data"].get("kind") == "records_lost"]
    assert lost and lost[-1]["first_step"] == 5 and lost[-1]["last_step"] == 6
    assert "steps 5-6 ran before the previous process stopped" in capsys.readouterr().err


def test_a_crash_after_its_save_names_the_step_without_a_record_as_stopped_not_killed(tmp_path, capsys):
    """A callback raised at step 7's end: the crash save kept step 7, whose record was never
    written. The resume said the step 'ran before the previous process was killed'."""
    class CrashAt(Callback):
        def on_batch_end(self, state):
            if state.step == 7:
                raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, every_steps=4), callbacks=[CrashAt()]).fit()
    capsys.readouterr()
    Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, every_steps=4, auto_resume=True)).fit()
    err = capsys.readouterr().err
    assert "step 7 ran before the previous process stopped" in err and "killed" not in err, err


def test_steps_a_resume_runs_again_are_said_and_read_once(tmp_path, capsys):
    """Killed after step 8 was recorded but before its checkpoint: the resume from step 6 runs
    steps 7-8 again. steps.jsonl read them twice (12 records of a 10-step run)."""
    Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, every_steps=3)).fit()
    (tmp_path / "r" / "checkpoints" / "step-00000008.pt").unlink()  # as if killed before step 8's save
    cfg = _cfg(tmp_path, every_steps=3, auto_resume=True)
    cfg["run"]["max_steps"] = 10
    Trainer(tiny_model(), mse, tiny_data(), config=cfg).fit()
    assert "steps 7-8 ran after the step-6 checkpoint and run again now" in capsys.readouterr().err
    run = read_run(tmp_path / "r")
    assert [r["step"] for r in run.steps] == list(range(1, 11))
    assert any("steps 7-8 ran twice" in note for note in run.skipped), run.skipped


def test_a_new_run_never_lands_in_a_run_directory_that_holds_another(tmp_path):
    """A second `run.name=o2` without a resume trained from step 1 into o2, appended to its
    steps.jsonl (steps 149, 150, 1, 2 ...), and a later --auto-resume took the old run's last
    checkpoint and pruned the new run's. Now it stops before writing anything."""
    from trainspeed.errors import ConfigError

    Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path)).fit()
    run = tmp_path / "r"
    steps, saved = (run / "steps.jsonl").read_bytes(), sorted(p.name for p in (run / "checkpoints").iterdir())
    with pytest.raises(ConfigError, match=r"already holds a run \(checkpoints up to step 8\): continue it with "
                                          r"--auto-resume .* or give this run another run.name; nothing was written"):
        Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path)).fit()
    assert (run / "steps.jsonl").read_bytes() == steps
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == saved
    # a resume of it is what that directory is for
    cfg = _cfg(tmp_path, auto_resume=True)
    cfg["run"]["max_steps"] = 10
    Trainer(tiny_model(), mse, tiny_data(), config=cfg).fit()
    assert [s["step"] for s in read_run(run).steps][-3:] == [8, 9, 10]


def test_auto_resume_without_a_run_name_continues_the_newest_run_of_the_target(tmp_path, capsys):
    """README: `trainspeed train my.yaml --auto-resume` ("newest intact checkpoint of the run
    directory"). The default run name is timestamped, so it started a new run every time."""
    def cfg(max_steps, **ckpt):
        c = _cfg(tmp_path, **ckpt)
        c["run"].update(name=None, max_steps=max_steps)
        c["recipe"] = {"name": "mymodel-build"}
        return c

    Trainer(tiny_model(), mse, tiny_data(), config=cfg(6)).fit()
    (done,) = list(tmp_path.iterdir())
    first = done.rename(tmp_path / "mymodel-build-20260101-000000")  # as if a while ago
    (tmp_path / "mymodel-build-20000101-000000").mkdir()  # an older run with nothing to resume
    (tmp_path / "other-20991231-235959" / "checkpoints").mkdir(parents=True)  # another target's
    capsys.readouterr()
    again = Trainer(tiny_model(), mse, tiny_data(), config=cfg(9, auto_resume=True))
    assert again.run_dir == first
    assert f"--auto-resume: continuing {first}, the newest run of mymodel-build" in capsys.readouterr().err
    again.fit()
    assert [s["step"] for s in read_run(first).steps][-4:] == [6, 7, 8, 9]
    fresh = Trainer(tiny_model(), mse, tiny_data(), config={**cfg(3, auto_resume=True), "recipe": {"name": "new"}})
    assert fresh.run_dir.name.startswith("new-")
    assert "no earlier run of new under" in capsys.readouterr().err


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_a_loss_fn_that_returns_a_per_sample_loss_is_named_before_any_checkpoint(tmp_path, precision):
    """A new user's loss_fn returned shape (32, 1) (no reduction): the run wrote a crash
    checkpoint at step 0 and ended in torch's "grad can be implicitly created only for scalar
    outputs"."""
    from trainspeed.errors import ConfigError

    def per_sample(model, batch):
        x, y = batch
        return nn.functional.mse_loss(model(x), y, reduction="none")

    cfg = _cfg(tmp_path)
    cfg["precision"] = {"mode": precision}
    with pytest.raises(ConfigError, match=r"loss_fn\(model, batch\) must return one number, a scalar loss tensor; "
                                          r"it returned a tensor of shape \(8, 1\)\. Reduce it"):
        Trainer(tiny_model(), per_sample, tiny_data(), config=cfg).fit()
    assert not list((tmp_path / "r").glob("checkpoints/step-*"))  # no crash checkpoint of an untrained model


@pytest.mark.parametrize("metric, every, said", [
    ("val_los", 4, "checkpoint.best_metric='val_los' is not among this checkpoint's metrics (val_loss); "
                   "did you mean 'val_loss'?: keep_best keeps no checkpoint for it"),
    ("val_loss", None, "checkpoint.keep_best=2 keeps the checkpoints with the best val_loss, which only "
                       "evaluations during training measure: set eval.every_steps (e.g. eval.every_steps=4), "
                       "or no checkpoint is kept as best"),
])
def test_a_best_metric_that_no_checkpoint_carries_is_said_once(tmp_path, metric, every, said):
    """`checkpoint.keep_best=2 checkpoint.best_metric=val_los` (or no evaluation during training
    to measure val_loss) kept no best checkpoint, without a word."""
    cfg = _cfg(tmp_path, keep_best=2, best_metric=metric, every_steps=4)
    cfg["eval"] = {"every_steps": every, "at_end": False}
    g = torch.Generator().manual_seed(2)
    val = TensorDataset(torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g))
    Trainer(tiny_model(), mse, tiny_data(), val_data=val, config=cfg).fit()
    warnings_said = [e["data"] for e in read_run(tmp_path / "r").events_of("warning")
                     if e["data"].get("kind") == "best_metric_missing"]
    assert [w["message"] for w in warnings_said] == [said]


class CtrlCAt(Callback):
    """A Ctrl-C that reaches the loop as KeyboardInterrupt (the second one, while a save runs)."""

    def __init__(self, step):
        self.step = step

    def on_batch_end(self, state):
        if state.step == self.step:
            raise KeyboardInterrupt


def test_a_ctrl_c_that_ends_the_run_at_once_names_the_checkpoint_kept(tmp_path, capsys):
    """It said only 'trainspeed: interrupted', with step 4's checkpoint there to resume from."""
    with pytest.raises(KeyboardInterrupt) as info:
        Trainer(tiny_model(), mse, tiny_data(), config=_cfg(tmp_path, every_steps=2), callbacks=[CtrlCAt(5)]).fit()
    assert getattr(info.value, "reported", False)  # the CLI adds no 'trainspeed: interrupted'
    ckpt = tmp_path / "r" / "checkpoints" / "step-00000004.pt"
    line = [x for x in capsys.readouterr().err.splitlines() if "interrupted at step" in x]
    assert line == [f"trainspeed: interrupted at step 5; the last checkpoint written, step 4 ({ckpt}), is kept: "
                    f"resume with {resume_command(ckpt, 'r')}"]
