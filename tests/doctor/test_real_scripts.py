"""The doctor on scripts written like real open-source ones (issue 25, "tried on real scripts"):
manual SGD with no optimizer (pytorch/examples word_language_model, regression), a sequence-
first LM without a DataLoader, nanoGPT's memmap get_batch with gradient accumulation and
--key=value flags, LBFGS with a closure and per-step plotting (time_sequence_prediction),
character windows that have no padding (minGPT chargpt), Lightning with a bigger validation
loader, and trainspeed.step() for a loop nothing else can read."""
from __future__ import annotations

import json
import statistics
import textwrap
from pathlib import Path

import pytest
import torch

import trainspeed
from doctor_helpers import SCRIPTS, ids
from trainspeed.doctor.instrument.batch import batch_stats, detect_pad_id

pytestmark = pytest.mark.timeout(180)


def _events(result, kind):
    events = [json.loads(line) for line in (result.run_dir / "events.jsonl").read_text().splitlines()]
    return [e["data"] for e in events if e["type"] == "observation" and e["data"]["kind"] == kind]


def _steps(result):
    return [json.loads(line) for line in (result.run_dir / "steps.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("model", ["LSTM", "Transformer"])
def test_manual_sgd_sequence_first_lm_has_steps_samples_and_tokens(doctor, model):
    result = doctor("word_lm_manual_sgd.py", "--model", model, steps=12)
    assert (result.stopped, result.steps, result.exit_code) == ("steps", 12, 0)
    boundary = _events(result, "step_boundary")[0]
    assert boundary["source"] == "backward" and boundary["optimizer_steps"] == 0
    assert boundary["input_batch_dim"] == 1  # (bptt=35, batch=20) token ids
    steps = _steps(result)
    # 20 sequences of 35 tokens per step: not 35 (dim 0), nor + 700 from the criterion module
    assert {s["samples"] for s in steps} == {20}
    assert {s["tokens"] for s in steps} <= {700, 20 * 34}  # an epoch's last slice is 34 long
    assert all(s.get("pad_tokens") in (None, 0) for s in steps)
    assert result.summary["phases"]["backward"]["share"] > 0
    assert "no_step_found" not in ids(result)


def test_manual_sgd_with_optimizer_counts_each_step_once(doctor):
    result = doctor("word_lm_manual_sgd.py", "--use-optimizer", steps=10)
    assert (result.stopped, result.steps) == ("steps", 10)
    assert _events(result, "step_boundary")[0]["source"] == "optimizer"
    assert _events(result, "accumulation")[0]["counts"] == {"1": 10}
    assert {s["samples"] for s in _steps(result)} == {20}


def test_regression_manual_update_is_stopped_by_steps(doctor):
    # `for batch_idx in count(1)` until the loss is tiny (never): only --steps ends it
    result = doctor("regression_manual.py", steps=15)
    assert (result.stopped, result.steps, result.exit_code) == ("steps", 15, 0)
    assert {s["samples"] for s in _steps(result)} == {32}
    assert _events(result, "step_boundary")[0]["source"] == "backward"


def test_nanogpt_accumulation_loss_tokens_and_data_phase(doctor, tmp_path):
    result = doctor("nanogpt_style.py", "--gradient_accumulation_steps=4", "--eval_interval=10", steps=16)
    assert (result.stopped, result.steps) == ("steps", 16)
    steps = _steps(result)
    # 4 micro-batches of (8, 64) token ids per step; Y is not counted again
    assert {s["samples"] for s in steps} == {32} and {s["tokens"] for s in steps} == {4 * 8 * 64}
    assert result.summary.get("tokens_per_s")
    assert _events(result, "batch")[0]["pad_source"] is None  # random tokens: no padding claimed
    # the loss the script prints (micro-batch loss x 4), not the divided one (4x too small)
    printed = [float(x) for x in (tmp_path / "printed_losses.txt").read_text().split()]
    recorded = [s["loss"] for s in steps]
    ratio = (sum(recorded) / len(recorded)) / (sum(printed[: len(recorded)]) / len(recorded))
    assert 0.85 < ratio < 1.15, (recorded[:4], printed[:4])
    # get_batch (randint, memmap slices, from_numpy, stack) is data, not "other". Judged on the
    # median step, as the means are not: on a loaded machine a few steps descheduled for 100+ ms
    # in "other" took its mean share to 19 % against data's 5 % (load 13 on 2 cores)
    measured = [s for s in steps if not s.get("warmup")]

    def median(key: str) -> float:
        return statistics.median(float(s["phases"].get(key) or 0.0) for s in measured)

    phases = {k: median(k) for k in ("data", "other")}
    # ~5 % of the step's CPU time: get_batch counted elsewhere leaves ~0 here. Against CPU time,
    # which the machine's load does not stretch: at load 15 on 2 cores a step's wall time was
    # 13x its CPU time, and the phases' wall times took the waits in no fixed order
    assert phases["data"] > 0.02 * statistics.median(s["cpu"] for s in measured), phases
    # data against "other" wall time, on the steps that waited for no other process (wall within
    # 1.5x CPU time): all of them on a quiet machine, often none at load 15
    ran = [s for s in measured if s["t_step"] < 1.5 * s["cpu"]]
    if len(ran) >= 5:
        share = {k: statistics.median(float(s["phases"].get(k) or 0.0) for s in ran) for k in ("data", "other")}
        assert share["data"] > share["other"] * 0.5, share
    data = next((f for f in result.findings if f["id"] == "data_bound"), None)
    if data is not None:
        assert "no DataLoader" in data["evidence"] and "even with workers" not in data["recommendation"]


def test_lbfgs_closure_is_one_step_and_plotting_is_not_eval(doctor):
    result = doctor("lbfgs_sine.py", "--steps", "100", steps=6)
    assert (result.stopped, result.steps) == ("steps", 6)
    acc = _events(result, "accumulation")[0]
    assert acc["factor"] == 1 and acc["closure_evaluations"] == 20
    assert "accumulation_for_speed" not in ids(result)
    assert {s["samples"] for s in _steps(result)} == {9}  # one batch of 9 series, not 20 x 9
    phases = result.summary["phases"]
    # the 20 ms "figure" after the no_grad prediction is not evaluation: its sleep (a floor no
    # load can lower) lands in "other"; an eval bound in ms failed on a busy machine
    assert phases["other"]["mean_s"] >= 0.0195, phases


def test_loop_without_backward_reports_what_it_saw_then_trainspeed_step_marks_it(tmp_path, monkeypatch):
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    monkeypatch.chdir(tmp_path)
    body = textwrap.dedent("""
        import torch
        from torch import nn
        {import_line}
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        for step in range(60):
            loss = nn.functional.mse_loss(model(x), y)
            grads = torch.autograd.grad(loss, list(model.parameters()))  # no backward, no optimizer
            with torch.no_grad():
                for p, g in zip(model.parameters(), grads):
                    p -= 0.01 * g
            {mark_line}
    """)
    script = tmp_path / "train.py"
    script.write_text(body.format(import_line="", mark_line=""))
    result = run_doctor(DoctorConfig(command=["python", str(script)], steps=10, out=tmp_path / "a",
                                     system_sampler=False))
    assert (result.stopped, result.steps) == ("end", 0)
    finding = next(f for f in result.findings if f["id"] == "no_step_found")
    assert "60 training forwards, 0 backwards and 0 torch.optim optimizer steps" in finding["evidence"]
    assert "trainspeed.step()" in finding["recommendation"]

    script.write_text(body.format(import_line="import trainspeed", mark_line="trainspeed.step()"))
    result = run_doctor(DoctorConfig(command=["python", str(script)], steps=10, out=tmp_path / "b",
                                     system_sampler=False))
    assert (result.stopped, result.steps) == ("steps", 10)
    assert _events(result, "step_boundary")[0]["source"] == "mark"
    assert {s["samples"] for s in _steps(result)} == {16}
    trainspeed.step()  # outside the doctor: a no-op


def test_mark_after_optimizer_step_does_not_double_count(doctor_code_like):
    result = doctor_code_like("""
        import trainspeed
        for step in range(100):
            nn.functional.mse_loss(model(x), y).backward()
            opt.step(); opt.zero_grad()
            trainspeed.step()
    """, steps=8)
    assert (result.stopped, result.steps) == ("steps", 8)
    assert _events(result, "accumulation")[0]["counts"] == {"1": 8}


def test_accumulation_with_optimizer_is_not_split_before_its_first_step(doctor_code_like):
    result = doctor_code_like("""
        for step in range(100):
            for micro in range(4):
                (nn.functional.mse_loss(model(x), y) / 4).backward()
            opt.step()
            opt.zero_grad()
    """, steps=6)
    assert _events(result, "accumulation")[0]["counts"] == {"4": 6}
    assert {s["samples"] for s in _steps(result)} == {16}


def test_character_windows_have_no_padding_guessed_from_spaces():
    # chargpt: windows of text; the space ends most windows (in runs) but also occurs inside them
    text = "def f(x):  \n    return x  " * 40
    ids_ = torch.tensor([ord(c) for c in text])
    rows = torch.stack([ids_[i:i + 27] for i in range(0, 27 * 12, 27)])
    assert detect_pad_id(rows) is None
    assert batch_stats(rows).pad_tokens == 0
    padded = torch.full((4, 10), 0)
    for i, n in enumerate((3, 5, 7, 9)):
        padded[i, :n] = torch.arange(1, n + 1)
    assert detect_pad_id(padded) == 0  # a value only ever at the ends: padding


def test_lightning_evidence_quotes_the_training_loader(doctor):
    result = doctor("lightning_val_loader.py", steps=30)
    loaders = _events(result, "dataloader")
    assert loaders[0]["role"] == "train" and loaders[0]["batch_size"] == 32
    data = next((f for f in result.findings if f["id"] == "data_bound"), None)
    if data is not None:
        assert "batch_size=32" in data["evidence"] and "batch_size=256" not in data["evidence"]
        assert "even with workers" not in data["recommendation"]
        assert "--workers 1" in data["recommendation"] and "now --workers 0" in data["recommendation"]


@pytest.fixture
def doctor_code_like(tmp_path, monkeypatch):
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    monkeypatch.chdir(tmp_path)
    prelude = textwrap.dedent("""
        import torch
        from torch import nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(4, 8), torch.randn(4, 1)
    """)

    def run(body: str, steps: int = 10):
        script = tmp_path / "train.py"
        script.write_text(prelude + textwrap.dedent(body))
        return run_doctor(DoctorConfig(command=["python", str(script)], steps=steps, out=tmp_path / "run",
                                       system_sampler=False))

    return run


def test_scripts_exist():
    for name in ("word_lm_manual_sgd.py", "regression_manual.py", "nanogpt_style.py", "lbfgs_sine.py",
                 "lightning_val_loader.py"):
        assert (SCRIPTS / name).is_file(), name
    assert Path(trainspeed.__file__).parent.joinpath("mark.py").is_file()
