from __future__ import annotations

import sys
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


def test_real_wandb_offline(tmp_path: Path) -> None:
    import importlib.util

    # Only the installed package counts: a fake left in sys.modules by another test is not it.
    if importlib.util.find_spec("wandb") is None or not hasattr(pytest.importorskip("wandb"), "init"):
        pytest.skip("wandb is not installed")
    from trainspeed.sinks.wandb_sink import WandbSink

    sink = WandbSink(project="trainspeed-test", mode="offline", dir=tmp_path)
    sink.write_steps([{"step": i, "loss": 1.0 / (i + 1), "t_step": 0.1} for i in range(3)])
    sink.close()
    assert any(tmp_path.rglob("*.wandb"))
