"""ProfileWindow on a bare Monitor: only the chosen steps are traced, phases are named ranges,
the hooks are gone outside the window, and a run ending inside the window still gets its trace."""

from __future__ import annotations

import json

import pytest
import torch

from trainspeed.errors import ConfigError
from trainspeed.telemetry import read_run
from trainspeed.telemetry.monitor import Monitor
from trainspeed.telemetry.profiling import parse_steps

pytestmark = pytest.mark.timeout(60)


def trace_names(path) -> set[str]:
    with open(path) as f:
        trace = json.load(f)  # uncompressed Chrome/Perfetto JSON
    return {e.get("name", "") for e in trace["traceEvents"]}


def _train(mon: Monitor, steps: int) -> None:
    model = torch.nn.Linear(8, 4)
    x = torch.randn(16, 8)
    for _ in range(steps):
        with mon.phase("data"):
            batch = x + 0
        with mon.phase("forward"):
            loss = model(batch).square().mean()
        with mon.phase("backward"):
            loss.backward()
        with mon.phase("optimizer"):
            model.weight.grad = None
        mon.step(samples=16, loss=loss)


def test_window_traces_only_its_steps_with_phase_ranges(tmp_path):
    mon = Monitor(tmp_path, log_every=4, system_sampler=False, warmup_steps=0, profile_steps="3-4")
    _train(mon, 3)
    assert "begin" in mon.__dict__  # hooks installed while the window is open
    _train(mon, 3)
    assert "begin" not in mon.__dict__ and "end" not in mon.__dict__  # and gone after it
    mon.close()
    names = trace_names(tmp_path / "profile_steps_3-4.json")
    for phase in ("data", "forward", "backward", "optimizer"):
        assert f"trainspeed.{phase}" in names
    steps = sorted(n for n in names if n.startswith("trainspeed.step#"))
    assert steps == ["trainspeed.step#3", "trainspeed.step#4"]
    assert "aten::mm" in names or "aten::addmm" in names  # real operator events, not just ours
    run = read_run(tmp_path)
    (event,) = [e for e in run.events if e["type"] == "profile"]
    assert event["data"]["path"] == "profile_steps_3-4.json"
    assert event["data"]["captured"] == [3, 4]
    # profiled steps and the export step are excluded from throughput
    assert [r["warmup"] for r in run.steps] == [False, False, True, True, True, False]


def test_run_ending_inside_the_window_exports_what_it_captured(tmp_path):
    mon = Monitor(tmp_path, log_every=10, system_sampler=False, profile_steps="2-50")
    _train(mon, 3)
    mon.close()
    names = trace_names(tmp_path / "profile_steps_2-50.json")
    assert {"trainspeed.step#2", "trainspeed.step#3"} <= names
    (event,) = [e for e in read_run(tmp_path).events if e["type"] == "profile"]
    assert event["data"]["captured"] == [2, 3]


def test_window_from_step_one(tmp_path):
    mon = Monitor(tmp_path, log_every=10, system_sampler=False, profile_steps="1-1")
    _train(mon, 2)
    mon.close()
    names = trace_names(tmp_path / "profile_steps_1-1.json")
    assert "trainspeed.forward" in names and "trainspeed.step#2" not in names


def test_no_window_no_file_and_no_hooks(tmp_path):
    mon = Monitor(tmp_path, log_every=10, system_sampler=False)
    _train(mon, 2)
    mon.close()
    assert not list(tmp_path.glob("profile_steps_*"))
    assert "begin" not in mon.__dict__


@pytest.mark.parametrize("bad", ["5", "6-5", "0-3", "a-b", (3,)])
def test_bad_ranges_are_config_errors(bad):
    with pytest.raises(ConfigError, match="START-END|START <= END"):
        parse_steps(bad)


def test_parse_steps():
    assert parse_steps(" 50 - 55 ") == (50, 55)
    assert parse_steps((2, 2)) == (2, 2)
