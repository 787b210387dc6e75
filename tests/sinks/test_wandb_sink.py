from __future__ import annotations

import sys
import time
import types
from pathlib import Path

import pytest

from trainspeed.errors import MissingDependencyError
from trainspeed.telemetry import schema

pytestmark = pytest.mark.timeout(60)


class FakeRun:
    def __init__(self, **kwargs) -> None:
        self.init_kwargs = kwargs
        self.logged: list[tuple[dict, dict]] = []
        self.summary: dict = {}
        self.finished = 0

    def log(self, data, **kw) -> None:
        self.logged.append((dict(data), kw))

    def finish(self) -> None:
        self.finished += 1


@pytest.fixture
def fake_wandb(monkeypatch):
    """A stand-in for the wandb module (the real one is an optional extra, not installed)."""
    runs: list[FakeRun] = []
    mod = types.ModuleType("wandb")

    def init(**kwargs):
        runs.append(FakeRun(**kwargs))
        return runs[-1]

    mod.init = init
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return runs


def test_logs_step_scalars_with_step(fake_wandb, tmp_path: Path) -> None:
    from trainspeed.sinks.wandb_sink import WandbSink

    sink = WandbSink(project="p", run_name="r", config={"x": float("nan")}, mode="offline",
                     dir=tmp_path / "w")
    (run,) = fake_wandb
    assert run.init_kwargs == {"project": "p", "name": "r", "mode": "offline",
                               "config": {"x": None}, "dir": str(tmp_path / "w")}
    sink.write_steps([{"step": 5, "loss": 1.5, "t_step": 0.5, "samples": 10},
                      {"step": 5, "loss": 1.4}])  # repeated step: W&B would reject step=5
    sink.write_event(schema.make_event("checkpoint", 5, 0.0, path="a.pt", seconds=2.0))
    sink.close()
    sink.close()
    assert run.logged[0] == ({"loss": 1.5, "time/step_ms": 500.0,
                              "throughput/samples_per_s": 20.0}, {"step": 5})
    assert run.logged[1] == ({"loss": 1.4}, {})
    assert run.logged[2] == ({"events/checkpoint/seconds": 2.0}, {"commit": False})
    assert run.summary["events/checkpoint"] == "checkpoint @ step 5: path=a.pt, seconds=2.0"
    assert run.finished == 1


def test_missing_wandb_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` fail
    from trainspeed.sinks.wandb_sink import WandbSink

    with pytest.raises(MissingDependencyError, match=r"trainspeed\[wandb\]"):
        WandbSink(mode="offline")


def _real_wandb():
    """The installed package, or skip; a fake left in sys.modules by another test must not count."""
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        pytest.skip("wandb is not installed")
    wandb = pytest.importorskip("wandb")
    assert hasattr(wandb, "init"), f"sys.modules['wandb'] is not the real package: {wandb!r}"
    return wandb


def test_real_wandb_offline(tmp_path: Path) -> None:
    _real_wandb()
    from trainspeed.sinks.wandb_sink import WandbSink

    sink = WandbSink(project="trainspeed-test", mode="offline", dir=tmp_path)
    sink.write_steps([{"step": i, "loss": 1.0 / (i + 1), "t_step": 0.1} for i in range(3)])
    sink.close()
    assert any(tmp_path.rglob("*.wandb"))


def test_monitor_with_wandb_sink_writes_an_offline_run_in_the_run_dir(tmp_path: Path, monkeypatch) -> None:
    _real_wandb()
    from trainspeed.telemetry.monitor import Monitor

    monkeypatch.setenv("WANDB_SILENT", "true")
    config = {"run": {"name": "w1"}, "data": {"batch_size": 8},
              "logging": {"wandb_project": "trainspeed-test", "wandb_mode": "offline"}}
    mon = Monitor(tmp_path, sinks=("jsonl", "wandb"), log_every=2, warmup_steps=0, system_sampler=False,
                  config=config)
    for i in range(4):
        with mon.phase("forward"):
            pass
        mon.step(samples=8, loss=1.0 / (i + 1))
    mon.close()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")  # offline: nothing left the machine
    (binary,) = run_dir.glob("run-*.wandb")
    # wandb 0.31 keeps an offline run's config, history and summary in this transaction log
    # (uploaded later by `wandb sync`); its records hold the keys as plain protobuf strings.
    # wandb's service process writes it: on a loaded machine (a full `make test` on 2 cores) the
    # log held only its header when finish() had returned, and its records came after.
    deadline = time.monotonic() + 30
    while b"events/run_end" not in (data := binary.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert b"batch_size" in data  # the run config reached W&B
    # history rows (a loaded writer may thin dashboard records, so not necessarily all four)
    assert b"time/step_ms" in data
    assert b"final/final_loss" in data and b"events/run_end" in data  # summary entries
