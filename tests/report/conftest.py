"""Run directories made by real short training runs (the lead's Monitor on a tiny MLP)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # helper modules next to this conftest


def make_run(run_dir: Path, *, steps: int = 30, hidden: int = 32, batch: int = 16, tokens: bool = True,
             pad_share: float = 0.25, slow_data: bool = False) -> Path:
    """Train a tiny MLP for `steps` steps under Monitor; returns the run directory."""
    import time

    import torch

    from trainspeed.telemetry.monitor import Monitor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    xs = torch.randn(steps * batch, 16)
    ys = xs[:, :1] * 0.5 + 0.1

    def loader():
        for i in range(steps):
            if slow_data:
                time.sleep(0.002)
            yield xs[i * batch:(i + 1) * batch], ys[i * batch:(i + 1) * batch]

    # env.json comes from telemetry.env once that lands; until then the fixture writes a small one.
    has_env = importlib.util.find_spec("trainspeed.telemetry.env") is not None
    mon = Monitor(run_dir, log_every=10, warmup_steps=3, flops_per_step=6 * batch * 16 * hidden * 2,
                  config={"model": {"hidden": hidden}, "batch_size": batch}, system_sampler=False,
                  write_env=has_env)
    if not has_env:
        (Path(run_dir) / "env.json").write_text(json.dumps({"schema": 1, "torch": torch.__version__}))
    for x, y in mon.loader(loader()):
        with mon.phase("forward"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        with mon.phase("backward"):
            loss.backward()
        with mon.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        kw = {"tokens": batch * 8, "pad_tokens": int(batch * 8 * pad_share)} if tokens else {}
        mon.step(samples=batch, loss=loss, lr=0.05, **kw)
    mon.close()
    return Path(run_dir)


def add_findings(run_dir: Path, findings: list[dict]) -> None:
    path = run_dir / "report.json"
    report = json.loads(path.read_text())
    report["findings"] = findings
    path.write_text(json.dumps(report))


FINDINGS = [
    {"id": "logging", "severity": "warning", "title": "Logging takes time", "evidence": "log 4% of step",
     "recommendation": "log less often", "verify_with": None, "impact": 0.04},
    {"id": "data_bound", "severity": "critical", "title": "Training waits for data",
     "evidence": "data phase is 61% of step time", "recommendation": "set num_workers=4",
     "verify_with": "trainspeed tune cfg.yaml --only data", "impact": 0.61},
    {"id": "pad", "severity": "warning", "title": "Padding waste", "evidence": "25% of tokens are padding",
     "recommendation": "bucket by length", "verify_with": None, "impact": 0.25},
]


@pytest.fixture(scope="session")
def run_a(tmp_path_factory) -> Path:
    path = make_run(tmp_path_factory.mktemp("runs") / "baseline", slow_data=True)
    add_findings(path, FINDINGS)
    return path


@pytest.fixture(scope="session")
def run_b(tmp_path_factory) -> Path:
    path = make_run(tmp_path_factory.mktemp("runs") / "tuned", hidden=16)
    # Monitor.close now diagnoses the run (its 25 % padding is a real finding); B stands for a
    # run with nothing to report, so the reports' "none" rendering is what is tested with it.
    add_findings(path, [])
    return path
