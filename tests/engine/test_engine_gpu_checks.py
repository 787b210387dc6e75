"""An engine run on CUDA gets the checks a script gets (fp32 on tensor cores, launch-bound
steps), with advice that names the config key, never "your own code" (issue 29). The engine's
observations are written as on a GPU (a torch.device("cuda") without CUDA: the device's own
properties come from a recorded H100, the model's from the engine)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainspeed.config import load_config
from trainspeed.doctor.checks import CheckContext, diagnose, loop
from trainspeed.engine.observations import emit_observations
from trainspeed.telemetry.rundir import RunData
from trainspeed.telemetry.schema import PHASES, make_event
from trainspeed.telemetry.summary import summarize

pytestmark = pytest.mark.timeout(60)

H100 = {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "total_memory": 80 * 2**30,
        "tf32_matmul": False, "bf16_supported": True}


class Recorder:
    def __init__(self):
        self.events = []

    def event(self, type_, **data):
        self.events.append(make_event(type_, 0, 0.0, **data))


def engine_events(monkeypatch, precision="fp32"):
    import trainspeed.engine.observations as obs

    monkeypatch.setattr(obs, "cuda_device_facts", lambda: dict(H100))  # what an H100 reports
    cfg = load_config({"precision": {"mode": precision}, "data": {"batch_size": 16}})
    loader = DataLoader(TensorDataset(torch.zeros(64, 4)), batch_size=16)
    mon = Recorder()
    emit_observations(mon, SimpleNamespace(train=loader, val=None), SimpleNamespace(train=None, val=None),
                      cfg, torch.device("cuda"), nn.Linear(4, 4))
    return mon.events


def engine_run(events, n=40, step=0.05, other_growth=0.0):
    steps = []
    for i in range(1, n + 1):
        phases = {p: 0.0 for p in PHASES}
        phases.update(forward=0.3 * step, backward=0.6 * step, other=0.1 * step + other_growth * i)
        steps.append({"schema": 1, "step": i, "t_wall": 100.0 + i * step, "t_step": sum(phases.values()),
                      "phases": phases, "samples": 16, "tokens": 1024, "warmup": i <= 2, "mem": {}})
    start = [make_event("run_start", 0, 0.0, device="cuda:0", precision="fp32")]
    return RunData(path=Path("."), steps=steps, events=start + events)


def test_engine_cuda_run_gets_the_fp32_check_with_the_config_key(monkeypatch):
    """`trainspeed train gpt` ran fp32 on an H100 and its report had no fp32 finding: the
    engine wrote no model observation, which the check reads."""
    events = engine_events(monkeypatch)
    kinds = [e["data"].get("kind") for e in events if e["type"] == "observation"]
    assert "model" in kinds and "batch" in kinds
    found = {f["id"]: f for f in diagnose(engine_run(events))}
    fp32 = found["fp32_on_tensor_cores"]
    assert fp32["recommendation"] == "precision.mode=bf16-mixed in the run's config"
    assert fp32["impact"] == pytest.approx(0.9 * (1 - 67 / 989.4), rel=0.02)  # forward+backward, no FLOPs
    assert "compile.mode=default in the run's config" in found["not_compiled"]["recommendation"]
    # a bf16 run: no fp32 finding
    assert "fp32_on_tensor_cores" not in {f["id"] for f in diagnose(engine_run(engine_events(monkeypatch, "bf16-mixed")))}


def test_engine_growth_outside_the_phases_names_the_config_not_your_code(monkeypatch):
    """A recipe run has no code of the user's: the growth advice names the config keys."""
    run = engine_run(engine_events(monkeypatch), n=200, other_growth=0.0005)
    f = loop.step_time_growth(CheckContext.from_run(run, summarize(run)))
    assert f is not None
    assert "your own code" not in f.evidence and "Python list" not in f.recommendation
    assert "logging.every" in f.recommendation and "callback" in f.recommendation
