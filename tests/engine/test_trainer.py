"""The Trainer against a hand-written PyTorch loop, accumulation, NaN policies, events."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainspeed.engine.events import Callback, Event
from trainspeed.engine.trainer import NonFiniteLossError, Trainer
from trainspeed.telemetry import read_run

pytestmark = pytest.mark.timeout(180)


def _data(n=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = x @ torch.randn(6, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))


def mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def _config(tmp_path, **sections):
    cfg = {
        "run": {"out_dir": str(tmp_path), "name": "t", "max_steps": 12, "seed": 3},
        "data": {"batch_size": 8, "shuffle": False},
        "logging": {"every": 5, "warmup_steps": 0, "progress": False},
        "checkpoint": {"save_final": False},
        "eval": {"at_end": False},
    }
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    return cfg


def test_switches_off_reproduces_a_hand_written_loop_exactly(tmp_path):
    dataset = _data()
    # the hand-written loop
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torch.manual_seed(3)
    expected = []
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=False,
                                         generator=torch.Generator().manual_seed(0))
    while len(expected) < 12:
        for batch in loader:
            loss = mse(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            expected.append(loss.item())
            if len(expected) == 12:
                break
    # the same work in the Trainer
    model2 = _model()
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.05, momentum=0.9)
    trainer = Trainer(model2, mse, dataset, optimizer=opt2, config=_config(tmp_path))
    summary = trainer.fit()
    run = read_run(tmp_path / "t")
    assert [r["loss"] for r in run.steps] == expected  # bit for bit
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    assert summary["steps"] == 12
    assert summary["phases"]["forward"]["share"] > 0


def test_accumulation_of_k_microbatches_equals_one_big_batch(tmp_path):
    dataset = _data(n=96)
    results = []
    for k, bs in ((1, 12), (3, 4)):
        model = nn.Linear(6, 1)
        torch.nn.init.zeros_(model.weight)
        torch.nn.init.zeros_(model.bias)
        cfg = _config(tmp_path, run={"name": f"acc{k}", "max_steps": 6},
                      data={"batch_size": bs}, accumulation={"steps": k},
                      optim={"name": "sgd", "lr": 0.1, "weight_decay": 0.0})
        Trainer(model, mse, dataset, config=cfg).fit()
        results.append((model.weight.detach().clone(), read_run(tmp_path / f"acc{k}")))
    (w1, run1), (w3, run3) = results
    torch.testing.assert_close(w1, w3, rtol=1e-5, atol=1e-6)
    l1 = [r["loss"] for r in run1.steps]
    l3 = [r["loss"] for r in run3.steps]
    assert l1 == pytest.approx(l3, rel=1e-5)
    assert [r["samples"] for r in run3.steps] == [12] * 6


class Recorder(Callback):
    def __init__(self):
        self.events = []

    def on_event(self, event, state):
        self.events.append(event)


def test_events_fire_in_order_and_eval_is_timed(tmp_path):
    rec = Recorder()
    cfg = _config(tmp_path, run={"max_steps": 4}, eval={"every_steps": 2, "limit_val_batches": 2})
    Trainer(_model(), mse, _data(), _data(n=32, seed=5), config=cfg, callbacks=[rec]).fit()
    ev = rec.events
    assert ev[0] is Event.FIT_START and ev[-1] is Event.FIT_END
    first_step = ev[ev.index(Event.BATCH_START):ev.index(Event.BATCH_END) + 1]
    assert first_step == [Event.BATCH_START, Event.AFTER_FORWARD, Event.AFTER_BACKWARD,
                          Event.OPTIMIZER_STEP, Event.BATCH_END]
    assert ev.count(Event.EVAL_START) == 2
    run = read_run(tmp_path / "t")
    evals = run.events_of("eval")
    assert len(evals) == 2 and evals[0]["data"]["val_loss"] > 0
    assert run.steps[1]["phases"]["eval"] > 0 and run.steps[0]["phases"]["eval"] == 0


def test_nan_policy_skip_and_stop(tmp_path):
    calls = {"n": 0}

    def flaky(model, batch):
        calls["n"] += 1
        loss = mse(model, batch)
        return loss * math.nan if calls["n"] == 3 else loss

    model = _model()
    cfg = _config(tmp_path, run={"name": "skip", "max_steps": 5})
    cfg["nan_policy"] = "skip"
    Trainer(model, flaky, _data(), config=cfg).fit()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    run = read_run(tmp_path / "skip")
    anomalies = run.events_of("anomaly")
    assert len(anomalies) == 1 and anomalies[0]["data"]["action"] == "skipped"

    calls["n"] = 0
    cfg = _config(tmp_path, run={"name": "stop", "max_steps": 10})
    cfg["nan_policy"] = "stop"
    with pytest.raises(NonFiniteLossError, match=r"NaN/Inf in [1-5] of the last 5 steps \(up to step 5\)"):
        Trainer(_model(), flaky, _data(), config=cfg).fit()
    report = read_run(tmp_path / "stop").report
    assert "NonFiniteLossError" in report["traceback"]


def test_only_listened_events_are_fired_and_generic_callbacks_hear_all(tmp_path):
    from trainspeed.engine.events import CallbackList

    class BatchEnd(Callback):
        def on_batch_end(self, state):
            pass

    class Everything(Callback):
        def __init__(self):
            self.seen = set()

        def on_event(self, event, state):
            self.seen.add(event)

    assert CallbackList([BatchEnd()]).listening == {Event.BATCH_END}
    assert CallbackList([]).listening == frozenset()
    every = Everything()
    Trainer(_model(), mse, _data(), config=_config(tmp_path), callbacks=[every]).fit()
    assert {Event.BATCH_START, Event.AFTER_FORWARD, Event.AFTER_BACKWARD,
            Event.OPTIMIZER_STEP, Event.BATCH_END} <= every.seen


def test_constant_lr_drops_the_scheduler_step_wrapper_but_keeps_a_users(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    Trainer(model, mse, _data(), optimizer=opt, config=_config(tmp_path)).fit()
    assert "step" not in opt.__dict__  # our never-stepped LambdaLR's wrapper was removed
    # a scheduler the user made on the optimizer keeps its wrapper (and its order warning)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.optim.lr_scheduler.StepLR(opt, step_size=5)
    Trainer(model, mse, _data(), optimizer=opt, config=_config(tmp_path, run={"name": "u"})).fit()
    assert getattr(opt.__dict__.get("step"), "_wrapped_by_lr_sched", False)
    # a warm-up schedule is stepped, so its wrapper stays too
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    tr = Trainer(model, mse, _data(), optimizer=opt,
                 config=_config(tmp_path, run={"name": "w"}, optim={"warmup_steps": 4}))
    tr.fit()
    assert getattr(opt.__dict__.get("step"), "_wrapped_by_lr_sched", False)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


class _EpochLog(Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int]] = []

    def on_epoch_end(self, state):
        self.seen.append(("end", state.epoch, state.step))

    def on_batch_end(self, state):
        self.seen.append(("batch", state.epoch, state.batch_in_epoch))


@pytest.mark.parametrize("max_steps, ends", [(6, 1), (7, 2)])
def test_epochs_end_after_their_last_short_group_and_not_at_the_step_limit(tmp_path, max_steps, ends):
    # 10 samples, batches of 2, groups of 2: each epoch trains groups of 2, 2 and 1 batches.
    # The last step of a run does not end its epoch (the loop stops before it looks for more
    # batches), so 6 steps end one epoch and 7 steps end two.
    log = _EpochLog()
    cfg = _config(tmp_path, run={"max_steps": max_steps}, data={"batch_size": 2},
                  accumulation={"steps": 2})
    trainer = Trainer(_model(), mse, _data(n=10), config=cfg, callbacks=[log])
    trainer.fit()
    batches = [(epoch, in_epoch) for kind, epoch, in_epoch in log.seen if kind == "batch"]
    assert batches[:6] == [(0, 2), (0, 4), (0, 5), (1, 2), (1, 4), (1, 5)]
    assert [s for s in log.seen if s[0] == "end"] == [("end", e, 3 * (e + 1)) for e in range(ends)]
    assert trainer.state.epoch == ends
    steps = read_run(tmp_path / "t").steps
    assert [s["samples"] for s in steps] == [4, 4, 2, 4, 4, 2, 4][:max_steps]


def test_mfu_from_a_per_token_count_follows_each_steps_tokens(tmp_path):
    # Batches of 2, 4 and 8 real tokens in turn: a per-token FLOP count times the first
    # batch's tokens would stand for none of the others. The report's achieved FLOP/s must be
    # the count times the measured tokens/s.
    from trainspeed.recipes.base import BatchStats

    def stats(batch):
        return BatchStats(samples=len(batch[0]), tokens=int(batch[0][:, 0].abs().sum().item()))

    x = torch.zeros(48, 6)
    x[:, 0] = torch.tensor([1.0, 2.0, 4.0]).repeat_interleave(2).repeat(8)  # per batch of 2: 2, 4, 8
    data = TensorDataset(x, torch.randn(48, 1))
    cfg = _config(tmp_path, run={"max_steps": 24}, data={"batch_size": 2}, logging={"warmup_steps": 3})
    Trainer(_model(), mse, data, config=cfg, batch_stats=stats, flops_per_token=1000.0).fit()
    summary = json.loads((tmp_path / "t" / "report.json").read_text())["summary"]
    run = read_run(tmp_path / "t")
    assert sorted({s["tokens"] for s in run.steps}) == [2, 4, 8]
    achieved = summary["mfu"]["value"] * summary["mfu"]["peak_flops"]
    assert achieved == pytest.approx(1000.0 * summary["tokens_per_s"], rel=1e-6)
