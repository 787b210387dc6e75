"""`trainspeed report A --compare B`: the throughput ratio with its bootstrap interval, and a
warning when the runs trained different models (or data, device, world size)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainspeed.cli.main import main
from trainspeed.report.compare import bootstrap_ratio, comparability, sameness_warnings
from trainspeed.telemetry.rundir import RunData, read_run

pytestmark = pytest.mark.timeout(240)


def _run(times, *, samples=8, warmup=0, **extra) -> RunData:
    steps = [{"step": i + 1, "t_step": t, "samples": samples, "tokens": 0, "warmup": i < warmup}
             for i, t in enumerate(times)]
    return RunData(path=__import__("pathlib").Path("x"), steps=steps, **extra)


def test_bootstrap_ratio_of_a_real_speedup_excludes_one():
    rng = np.random.default_rng(1)
    a = 8 / rng.normal(0.010, 0.001, 200)  # samples/s per step
    b = 8 / rng.normal(0.005, 0.0005, 200)  # twice as fast
    value, low, high = bootstrap_ratio(a, b)
    assert value == pytest.approx(2.0, rel=0.05)
    assert low < value < high and low > 1.8 and high < 2.2


def test_bootstrap_ratio_of_the_same_distribution_contains_one():
    rng = np.random.default_rng(2)
    a, b = rng.normal(100, 10, 150), rng.normal(100, 10, 150)
    value, low, high = bootstrap_ratio(a, b)
    assert low < 1.0 < high and high - low < 0.1


def test_interval_excludes_warmup_and_reads_as_words():
    rng = np.random.default_rng(3)
    a = _run([5.0] * 3 + list(rng.normal(0.010, 0.0005, 60)), warmup=3)  # slow warm-up steps ignored
    b = _run(list(rng.normal(0.008, 0.0004, 60)))
    comp = comparability(a, b)
    iv = comp.interval
    assert iv.metric == "samples/s" and iv.steps == (60, 60)
    assert iv.ratio == pytest.approx(1.25, rel=0.05) and iv.significant
    assert "95% interval" in iv.text() and "B is faster" in iv.text()
    assert comp.warnings == []


def test_noise_is_not_called_faster():
    rng = np.random.default_rng(4)
    a, b = _run(list(rng.normal(0.010, 0.002, 40))), _run(list(rng.normal(0.010, 0.002, 40)))
    iv = comparability(a, b).interval
    assert not iv.significant and "within the noise" in iv.text()


def test_too_few_steps_give_no_interval():
    assert comparability(_run([0.01] * 3), _run([0.01] * 50)).interval is None


def test_warnings_name_what_differs():
    def with_facts(model, params, dataset, device, cpu, ranks=0):
        run = _run([0.01] * 10, env={"cpu": {"model": cpu}})
        run.events = [{"type": "run_start", "data": {"device": device}},
                      {"type": "model", "data": {"name": model, "params": params}},
                      {"type": "observation", "data": {"kind": "dataloader", "role": "train",
                                                       "dataset": dataset, "dataset_len": 100}}]
        run.rank_steps = {r: [] for r in range(1, ranks + 1)}
        return run

    same = with_facts("MLP", 1000, "Toy", "cpu", "Xeon")
    assert sameness_warnings(same, with_facts("MLP", 1000, "Toy", "cpu", "Xeon")) == []
    warnings = sameness_warnings(same, with_facts("Big", 5_000_000, "Other", "cuda", "Xeon", ranks=1))
    text = " | ".join(warnings)
    assert len(warnings) == 4
    assert "different models: A MLP (1,000 parameters), B Big (5M parameters)" in text
    assert "different data" in text and "different devices: A cpu (Xeon), B cuda" in text
    assert "different world sizes: A 1 process(es), B 2" in text
    # a resumed run records its model once per process: the same model, not twice its size
    resumed = with_facts("MLP", 1000, "Toy", "cpu", "Xeon")
    resumed.events += [{"type": "run_start", "data": {"device": "cpu"}}, {"type": "model", "data": {"name": "MLP", "params": 1000}}]
    assert sameness_warnings(same, resumed) == []
    # a fact one run did not record is not a difference
    bare = _run([0.01] * 10)
    bare.events = [{"type": "run_start", "data": {"device": "cpu"}}]
    assert sameness_warnings(same, bare) == []


def _mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory):
    from trainspeed.engine.trainer import Trainer

    root = tmp_path_factory.mktemp("cmp")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    data = TensorDataset(x, x[:, :1])
    for name, width in (("small", 8), ("wide", 256)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, width), nn.Tanh(), nn.Linear(width, 1))
        cfg = {"run": {"out_dir": str(root), "name": name, "max_steps": 40, "seed": 0, "torch_threads": 1},
               "data": {"batch_size": 8}, "logging": {"every": 20, "warmup_steps": 2, "progress": False},
               "checkpoint": {"save_final": False}, "eval": {"at_end": False}}
        Trainer(model, _mse, data, config=cfg).fit()
    return root / "small", root / "wide"


def test_compare_cli_warns_on_different_models_and_prints_the_interval(trainer_runs, capsys):
    a, b = trainer_runs
    assert main(["report", str(a), "--compare", str(b), "--no-html"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "Warning: A and B differ: different models: A Sequential (145 parameters), " \
           "B Sequential (4,609 parameters)" in out
    assert "B/A samples/s (median per step) = " in out and "95% interval" in out
    assert "38 and 38 steps resampled" in out  # 40 steps less 2 warm-up


def test_compare_cli_json_carries_comparability(trainer_runs, capsys):
    a, b = trainer_runs
    assert main(["report", str(a), "--compare", str(b), "--json", "--no-html"]) == 0
    doc = json.loads(capsys.readouterr().out)
    comp = doc["comparability"]
    assert comp["warnings"][0].startswith("different models")
    iv = comp["interval"]
    assert iv["low"] <= iv["ratio"] <= iv["high"] and iv["level"] == 0.95 and iv["metric"] == "samples/s"


def test_same_model_twice_has_no_warning(trainer_runs):
    a, _ = trainer_runs
    assert sameness_warnings(read_run(a), read_run(a)) == []


def test_the_headline_reads_the_interval_not_the_bare_ratio():
    """The demo printed 'B is 1.15x faster' under an interval of 0.83-2.30: the headline now
    says 'within the noise' when the interval holds 1, and the factor with its interval when not."""
    from trainspeed.report.compare import RatioInterval, headline

    rows = [{"group": "throughput", "metric": "samples/s", "ratio": 1.15, "verdict": "1.15x faster"}]
    noisy = RatioInterval(metric="samples/s", ratio=1.69, low=0.83, high=2.30, steps=(36, 36))
    assert headline(rows, noisy).startswith("B and A are within the noise of each other")
    assert "0.83-2.30" in headline(rows, noisy)
    slower = RatioInterval(metric="tokens/s", ratio=0.5, low=0.45, high=0.55, steps=(50, 50))
    assert headline(rows, slower).startswith("B is 2.00x slower than A (tokens/s")
    assert headline(rows) == "B is 1.15x faster than A (throughput samples/s, B/A = 1.15)"
