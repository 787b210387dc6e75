"""TrainspeedCallback in a real transformers Trainer.train: a valid run directory, phases split
by the model hooks, interval work (log/eval/save) attributed, findings and a profile window."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from trainspeed.integrations.hf import TrainspeedCallback  # noqa: E402
from trainspeed.telemetry import read_run  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def _model():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
    return transformers.GPT2LMHeadModel(cfg)


def _data(n=48, length=16, real=12):
    """Sequences padded to 16 with 12 real tokens each: padding share 25 %."""
    g = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(n):
        ids = torch.randint(1, 64, (length,), generator=g)
        mask = torch.zeros(length, dtype=torch.long)
        mask[:real] = 1
        ids[real:] = 0
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})
    return rows


def _train(tmp_path, cb, **overrides):
    kwargs = dict(output_dir=str(tmp_path / "out"), max_steps=8, per_device_train_batch_size=4,
                  logging_steps=4, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                  dataloader_num_workers=0, learning_rate=1e-3, seed=0)
    kwargs.update(overrides)
    args = transformers.TrainingArguments(**kwargs)
    trainer = transformers.Trainer(model=_model(), args=args, train_dataset=_data(),
                                   eval_dataset=_data(8), callbacks=[cb])
    trainer.train()
    return trainer


def test_train_writes_run_dir_with_phases_and_findings(tmp_path):
    cb = TrainspeedCallback(tmp_path / "run", log_every=4, warmup_steps=1, report=False)
    trainer = _train(tmp_path, cb)
    run = read_run(tmp_path / "run")
    assert [r["step"] for r in run.steps] == list(range(1, 9))
    assert all(r["samples"] == 4 for r in run.steps)
    # tokens from the attention mask (CPU tensors), padding on top of them
    assert all(r["tokens"] == 48 and abs(r["pad_share"] - 0.25) < 1e-9 for r in run.steps)
    for phase in ("forward", "backward", "optimizer", "h2d"):
        assert all(r["phases"][phase] > 0 for r in run.steps), phase
    assert all(r["phases"]["data"] > 0 for r in run.steps[1:])  # step 1 starts at its first hook
    # the Trainer logs at steps 4 and 8: those steps carry the log phase and the logged loss
    assert [r["step"] for r in run.steps if r["loss"] is not None] == [4, 8]
    assert [r["step"] for r in run.steps if r["phases"]["log"] > 0] == [4, 8]
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert [r["loss"] for r in run.steps if r["loss"] is not None] == pytest.approx(logged)
    assert all(r["lr"] is not None for r in run.steps)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["summary"]["steps"] == 8
    ids = [f["id"] for f in report["findings"]]
    assert "padding_waste" in ids and cb.findings == report["findings"]
    assert not cb._handles  # model hooks removed after training


def test_eval_and_save_are_their_phases_and_accumulation_sums(tmp_path):
    cb = TrainspeedCallback(tmp_path / "run", log_every=2, warmup_steps=0, report=False)
    _train(tmp_path, cb, max_steps=4, gradient_accumulation_steps=2, eval_strategy="steps",
           eval_steps=2, save_strategy="steps", save_steps=4, logging_steps=100)
    run = read_run(tmp_path / "run")
    assert [r["samples"] for r in run.steps] == [8, 8, 8, 8]
    assert [r["step"] for r in run.steps if r["phases"]["eval"] > 0] == [2, 4]
    assert [r["step"] for r in run.steps if r["phases"]["ckpt"] > 0] == [4]
    assert (tmp_path / "out" / "checkpoint-4").is_dir()


def test_profile_window_and_rendered_report(tmp_path, capsys):
    cb = TrainspeedCallback(tmp_path / "run", log_every=4, warmup_steps=0, profile_steps="3-4",
                            report=True, html=False)
    _train(tmp_path, cb, max_steps=6)
    with open(tmp_path / "run" / "profile_steps_3-4.json") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert {"trainspeed.forward", "trainspeed.backward", "trainspeed.optimizer", "trainspeed.step#3"} <= names
    assert "trainspeed.step#5" not in names
    out = capsys.readouterr().out
    assert "trainspeed report" in out and "profile_steps_3-4.json" in out


def test_missing_transformers_names_the_extra(monkeypatch):
    import importlib
    import sys

    from trainspeed.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.delitem(sys.modules, "trainspeed.integrations.hf")
    with pytest.raises(MissingDependencyError, match=r"trainspeed\[hf\]"):
        importlib.import_module("trainspeed.integrations.hf")


class _Boom(RuntimeError):
    pass


def _crashing_model(at_call: int):
    """A model whose `at_call`-th forward raises (a pre-hook: the signature stays intact)."""
    model = _model()
    calls = {"n": 0}

    def boom(module, args):
        calls["n"] += 1
        if calls["n"] == at_call:
            raise _Boom("planted failure in forward")

    model.register_forward_pre_hook(boom)
    return model


def test_crash_in_train_is_recorded_by_close(tmp_path):
    """transformers has no exception callback: close(error=...) writes report.json with the
    traceback and keeps the steps measured before the crash."""
    cb = TrainspeedCallback(tmp_path / "run", log_every=2, warmup_steps=0, report=False)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=8,
                                          per_device_train_batch_size=4, report_to=[], save_strategy="no",
                                          use_cpu=True, disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model=_crashing_model(5), args=args, train_dataset=_data(),
                                   callbacks=[cb])
    with pytest.raises(_Boom) as info:
        trainer.train()
    cb.close(error=info.value)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert "_Boom: planted failure in forward" in report["traceback"]
    run = read_run(tmp_path / "run")
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4]
    assert [e["type"] for e in run.events].count("crash") == 1
    cb.close(error=info.value)  # idempotent
    assert [e["type"] for e in read_run(tmp_path / "run").events].count("crash") == 1


def test_uncaught_crash_is_recorded_at_exit(tmp_path):
    """A script that dies on the exception still leaves report.json with its traceback."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import transformers
        from test_hf_callback import _crashing_model, _data
        from trainspeed.integrations.hf import TrainspeedCallback
        cb = TrainspeedCallback({str(tmp_path / "run")!r}, log_every=2, warmup_steps=0, report=False)
        args = transformers.TrainingArguments(output_dir={str(tmp_path / "out")!r}, max_steps=8,
            per_device_train_batch_size=4, report_to=[], save_strategy="no", use_cpu=True,
            disable_tqdm=True, seed=0)
        transformers.Trainer(model=_crashing_model(3), args=args, train_dataset=_data(),
                             callbacks=[cb]).train()
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 1 and "planted failure" in proc.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert "planted failure in forward" in report["traceback"]
    assert [r["step"] for r in read_run(tmp_path / "run").steps] == [1, 2]
