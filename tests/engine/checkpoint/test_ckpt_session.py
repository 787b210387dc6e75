from __future__ import annotations

import contextlib
import os
import signal
import types

import pytest
import torch

from trainspeed.engine.checkpoint import TrainState, build_checkpoint
from trainspeed.engine.checkpoint.manager import CheckpointManager, checkpoint_name
from trainspeed.engine.checkpoint.session import CheckpointSession

pytestmark = pytest.mark.timeout(60)


class FakeMonitor:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []
        self.phases: list[str] = []

    def event(self, type_: str, **data) -> None:
        self.events.append((type_, data))

    @contextlib.contextmanager
    def phase(self, name: str):
        self.phases.append(name)
        yield


def _cfg(**kw):
    base = dict(dir=None, every_steps=2, every_minutes=None, keep_last=3, keep_best=0,
                best_metric="val_loss", best_mode="min", save_final=True, async_save=True,
                mirror=None, resume=None, auto_resume=True, save_on_crash=True)
    base.update(kw)
    return types.SimpleNamespace(**base)


class Loop:
    """A tiny deterministic training loop with data-order state, like the Trainer's."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=0.05)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: 1.0 / (1 + s))
        self.counters = TrainState()
        data_gen = torch.Generator().manual_seed(7)
        self.data = [torch.randn(4, 3, generator=data_gen) for _ in range(10)]

    def make_state(self):
        return build_checkpoint(self.model, self.opt, self.sched, None, self.counters,
                                {"batch_in_epoch": self.counters.batch_in_epoch}, {"lr": 0.05})

    def step(self) -> None:
        x = self.data[self.counters.batch_in_epoch]
        noise = 0.01 * torch.randn(4, 1)  # global RNG: restored with the checkpoint
        loss = (self.model(x) - x.sum(1, keepdim=True) + noise).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.sched.step()
        self.counters.step += 1
        self.counters.batch_in_epoch += 1


def _run(run_dir, steps: int, *, crash_at: int | None = None, monitor=None) -> Loop:
    loop = Loop()
    session = CheckpointSession.from_config(_cfg(), run_dir, monitor=monitor, handle_signals=False)
    resumed = session.resume(loop.model, loop.opt, loop.sched)
    if resumed is not None:
        loop.counters = resumed.counters
        assert resumed.sampler == {"batch_in_epoch": loop.counters.batch_in_epoch}
    try:
        with session:
            while loop.counters.step < steps:
                if loop.counters.step == crash_at:
                    raise RuntimeError("boom")
                loop.step()
                session.step_end(loop.counters.step, loop.make_state)
            session.finish(loop.counters.step, loop.make_state)
    except RuntimeError as exc:
        session.crash(exc, loop.counters.step, loop.make_state)
    return loop


def test_crash_then_auto_resume_continues_exactly(tmp_path):
    reference = _run(tmp_path / "ref", 7)
    mon = FakeMonitor()
    _run(tmp_path / "run", 7, crash_at=5, monitor=mon)
    saves = [d for t, d in mon.events if t == "checkpoint"]
    assert [(d["ckpt_step"], d["reason"]) for d in saves] == [(2, "periodic"), (4, "periodic"), (5, "crash")]
    assert mon.phases == ["ckpt"] * 3
    mon2 = FakeMonitor()
    resumed = _run(tmp_path / "run", 7, monitor=mon2)
    restart = [d for t, d in mon2.events if t == "restart"]
    assert restart and restart[0]["from_step"] == 5
    assert [d["reason"] for t, d in mon2.events if t == "checkpoint"] == ["periodic", "final"]
    for a, b in zip(reference.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    assert resumed.sched.state_dict()["last_epoch"] == reference.sched.state_dict()["last_epoch"]


def test_oom_is_not_saved(tmp_path):
    loop = Loop()
    session = CheckpointSession.from_config(_cfg(), tmp_path, handle_signals=False)
    assert session.crash(torch.cuda.OutOfMemoryError("CUDA out of memory"), 0, loop.make_state) is None
    assert session.manager.list_checkpoints() == []
    assert session.crash(RuntimeError("x"), 3, loop.make_state) == tmp_path / "checkpoints" / checkpoint_name(3)


def test_crash_save_failure_is_an_event_not_a_new_error(tmp_path):
    mon = FakeMonitor()
    session = CheckpointSession.from_config(_cfg(async_save=False), tmp_path, monitor=mon, handle_signals=False)
    assert session.crash(RuntimeError("x"), 3, lambda: {"bad": lambda: 0}) is None
    assert any(d.get("kind") == "crash_save_failed" for t, d in mon.events if t == "warning")


def test_sigterm_saves_at_step_boundary_and_exits_143(tmp_path):
    loop = Loop()
    mon = FakeMonitor()
    infos = []
    session = CheckpointSession.from_config(_cfg(every_steps=None), tmp_path, monitor=mon,
                                            on_checkpoint=infos.append)
    with pytest.raises(SystemExit) as exit_info:
        with session:
            for _ in range(5):
                loop.step()
                if loop.counters.step == 3:
                    os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-"step"; acted on at the boundary
                session.step_end(loop.counters.step, loop.make_state)
    assert exit_info.value.code == 143
    assert loop.counters.step == 3
    path = CheckpointManager(tmp_path / "checkpoints").find_resumable()
    assert path.name == checkpoint_name(3)  # complete on disk before exit (waited)
    assert [i["reason"] for i in infos] == ["signal"]
    assert ("warning", {"kind": "signal_exit", "signal": "SIGTERM", "at_step": 3}) in mon.events
