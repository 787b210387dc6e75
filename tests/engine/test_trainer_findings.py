"""A Trainer run (the README's Python example) ends with findings in report.json that name the
engine's own settings, and a verify command its user can run (no recipe: no `tune CONFIG`)."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainspeed.cli.main import main
from trainspeed.engine.trainer import Trainer

pytestmark = pytest.mark.timeout(240)


class SlowDataset(Dataset):
    """Per-sample work in the training process (num_workers=0): ~4 ms a batch of 8."""

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(0.0005)
        x = torch.full((32,), float(i % 7))
        return x, x[:1]


def mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def _config(tmp_path, name, steps=60):
    return {"run": {"out_dir": str(tmp_path), "name": name, "max_steps": steps, "seed": 0, "torch_threads": 1},
            "data": {"batch_size": 8, "num_workers": 0, "shuffle": False},
            "logging": {"every": 20, "warmup_steps": 2, "progress": False},
            "checkpoint": {"save_final": False}, "eval": {"at_end": False}}


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainer")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    Trainer(model, mse, SlowDataset(), config=_config(root, "slow")).fit()
    return root / "slow"


def test_trainer_run_has_data_bound_in_report_json(slow_run):
    report = json.loads((slow_run / "report.json").read_text())
    assert report["diagnosis"]["by"] == "Monitor.close"
    first = report["findings"][0]
    assert first["id"] == "data_bound" and first["severity"] == "critical" and first["impact"] >= 0.30
    # the engine stated its loader: the finding is about it, not "no DataLoader"
    assert "num_workers=0" in first["evidence"] and "(no DataLoader)" not in first["evidence"]
    assert "engine: data.num_workers=" in first["recommendation"]


def test_trainer_verify_is_a_comparison_with_the_engine_setting(slow_run):
    verify = json.loads((slow_run / "report.json").read_text())["findings"][0]["verify_with"]
    # no recipe.name: `trainspeed tune config.yaml` cannot build the user's model
    assert "tune" not in verify
    assert verify.startswith(f"trainspeed report {slow_run} --compare NEW_RUN_DIR (after re-running with "
                             "data.num_workers=")


def test_trainer_run_report_cli_shows_it(slow_run, capsys):
    assert main(["report", str(slow_run), "--no-html"]) == 0
    out = capsys.readouterr().out
    assert "data-bound" in out and "data.num_workers=" in out


def test_trainer_given_a_dataloader_does_not_claim_engine_settings(tmp_path):
    """A DataLoader passed in is used as is: data.num_workers would not change it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 1))
    loader = DataLoader(SlowDataset(), batch_size=8, num_workers=0)
    Trainer(model, mse, loader, config=_config(tmp_path, "given", steps=30)).fit()
    report = json.loads((tmp_path / "given" / "report.json").read_text())
    finding = next(f for f in report["findings"] if f["id"] == "data_bound")
    assert finding["verify_with"].endswith("--compare NEW_RUN_DIR (after the change)")
    events = [json.loads(line) for line in (tmp_path / "given" / "events.jsonl").read_text().splitlines()]
    loaders = [e["data"] for e in events if e["type"] == "observation" and e["data"].get("kind") == "dataloader"]
    assert loaders[0]["role"] == "train" and loaders[0]["built_by"] == "user" and loaders[0]["batch_size"] == 8
