"""A Hydra app's settings are its config's `key=value` overrides: the doctor recorded Hydra's own
argparse options (--help, --hydra-help, --multirun) as the script's flags, and advised
`DataLoader(..., num_workers=1)` and "engine: logging.every=50" for an app whose command line
takes `data.num_workers=...` and `trainer.log_every=...`."""

from __future__ import annotations

import json
import shlex

import pytest

from test_checks import LOADER0, ctx_of, make_run
from trainspeed.doctor.checks import data
from trainspeed.patches.plan import command_with_flags

pytestmark = pytest.mark.timeout(120)

CONFIG = """data:
  num_workers: 0
  batch_size: 16
trainer:
  lr: 0.001
  log_every: 1
  epochs: 100
  run_name: ${data.batch_size}-run
"""

APP = '''import hydra
import torch
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    data = torch.utils.data.TensorDataset(torch.randn(2048, 32), torch.randn(2048, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=cfg.data.batch_size, num_workers=cfg.data.num_workers)
    model = torch.nn.Linear(32, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.trainer.lr)
    step = 0
    for epoch in range(cfg.trainer.epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % cfg.trainer.log_every == 0:
                print(step, loss.item())
            step += 1


if __name__ == "__main__":
    main()
'''


def test_a_hydra_override_is_replaced_in_place():
    command = ["python", "train.py", "data.batch_size=32", "trainer.lr=0.1"]
    assert command_with_flags(command, ["data.batch_size=64"]) == ["python", "train.py", "data.batch_size=64",
                                                                  "trainer.lr=0.1"]
    assert command_with_flags(command, ["trainer.log_every=50"])[-1] == "trainer.log_every=50"


def test_the_doctor_reads_the_composed_config_and_advises_its_overrides(tmp_path, monkeypatch):
    pytest.importorskip("hydra")
    from hydra.core.global_hydra import GlobalHydra

    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text(CONFIG)
    (tmp_path / "train.py").write_text(APP)
    try:
        result = run_doctor(DoctorConfig(command=["python", "train.py", "data.batch_size=32"], steps=20,
                                         out=tmp_path / "run", system_sampler=False))
    finally:
        GlobalHydra.instance().clear()
    assert result.steps == 20, result.traceback
    flags = [json.loads(line)["data"] for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()
             if '"script_flags"' in line]
    assert flags and flags[0]["source"] == "hydra"
    values = {r["option"]: r["value"] for r in flags[0]["flags"]}
    # the config the run composed (the override applied); no interpolation, none of Hydra's own
    assert values == {"data.num_workers": 0, "data.batch_size": 32, "trainer.lr": 0.001, "trainer.log_every": 1,
                      "trainer.epochs": 100}
    syncs = next(f for f in result.findings if f["id"] == "host_syncs")
    assert "(trainer.log_every=1): log less often, trainer.log_every=50" in syncs["recommendation"]
    verify = shlex.split(syncs["verify_with"].split(" (")[0])
    assert verify[verify.index("--"):] == ["--", "python", "train.py", "data.batch_size=32", "trainer.log_every=50"]


def test_a_batch_that_waits_less_than_a_hand_over_is_not_sent_to_a_worker():
    # the app above: 0.3 ms waited for a TensorDataset batch, and its tune measured one worker at 0.35x
    f = data.data_bound(ctx_of(make_run(shares={"data": 0.25, "forward": 0.4}, step=0.001, obs=[LOADER0])))
    assert f.recommendation.startswith("make building a batch cheaper (") and "num_workers=7" not in f.recommendation
    assert "a worker would likely cost more than it saves" in f.recommendation
    assert f.verify_with.endswith("--knobs num_workers")  # the tune measures workers all the same
