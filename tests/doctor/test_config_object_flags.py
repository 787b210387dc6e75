"""minGPT-style config trees: `config.merge_from_args(sys.argv[1:])` sets any key as
`--trainer.num_workers=0`. minGPT's adder read its DataLoader's num_workers from
`config.num_workers` inside mingpt/trainer.py, and the advice pointed at that library line; the
script's own `--trainer.num_workers` flag is what a user types."""

from __future__ import annotations

import json
import sys

import pytest

from test_checks import LOADER0, ctx_of, make_run
from trainspeed.doctor.checks import data
from trainspeed.doctor.checks.script_flags import find_flag
from trainspeed.doctor.instrument.config_objects import config_object_flags, script_globals

pytestmark = pytest.mark.timeout(120)

# minGPT's mingpt/utils.py CfgNode, in its essentials
CFGNODE = '''from ast import literal_eval
class CfgNode:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)
    def to_dict(self):
        return {k: v.to_dict() if isinstance(v, CfgNode) else v for k, v in self.__dict__.items()}
    def merge_from_args(self, args):
        for arg in args:
            key, val = arg.split("=")
            try:
                val = literal_eval(val)
            except ValueError:
                pass
            *path, leaf = key[2:].split(".")
            obj = self
            for k in path:
                obj = getattr(obj, k)
            assert hasattr(obj, leaf)
            setattr(obj, leaf, val)
'''

SCRIPT = '''import sys
import torch
from cfg import CfgNode as CN

def get_config():
    C = CN()
    C.system = CN(seed=3407, work_dir="./out")
    C.trainer = CN(num_workers=0, batch_size=8, learning_rate=5e-4, betas=(0.9, 0.95))
    return C

config = get_config()
config.merge_from_args(sys.argv[1:])
train_config = config.trainer  # a subtree under a name of its own: the same keys
data = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
loader = torch.utils.data.DataLoader(data, batch_size=train_config.batch_size, num_workers=train_config.num_workers)
model = torch.nn.Linear(16, 1)
opt = torch.optim.AdamW(model.parameters(), lr=train_config.learning_rate)
for epoch in range(100):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


@pytest.fixture
def cfg_module(tmp_path, monkeypatch):
    (tmp_path / "cfg.py").write_text(CFGNODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cfg", raising=False)
    import cfg

    return cfg


def test_a_config_tree_gives_its_dotted_keys_once(cfg_module):
    CN = cfg_module.CfgNode
    config = CN(system=CN(seed=1), trainer=CN(num_workers=4, batch_size=64, betas=(0.9, 0.95), inner=CN(depth=2)))
    rows = {r["dest"]: r for r in config_object_flags({"config": config, "train_config": config.trainer,
                                                        "deep": config.trainer.inner, "_hidden": CN(x=1)})}
    # the subtrees bound to names of their own are the root's keys again; tuples are not flags
    assert set(rows) == {"system.seed", "trainer.num_workers", "trainer.batch_size", "trainer.inner.depth"}
    assert rows["trainer.num_workers"]["value"] == 4 and rows["trainer.num_workers"]["option"] == "--trainer.num_workers"
    assert all(r["kind"] == "equals" for r in rows.values())
    assert config_object_flags({"n": 3, "text": "x"}) == [] and config_object_flags(None) == []
    # the setting's flag is the dotted key that ends in its name
    assert find_flag(list(rows.values()), "num_workers")["dest"] == "trainer.num_workers"
    assert find_flag(list(rows.values()), "batch_size")["dest"] == "trainer.batch_size"
    two = [*rows.values(), {**rows["trainer.num_workers"], "dest": "eval.num_workers"}]
    assert find_flag(two, "num_workers") is None  # which one the step's loader reads is unknown


def test_the_scripts_globals_come_from_its_traceback(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("marker = 41\nraise RuntimeError('stop')\n")
    import runpy

    with pytest.raises(RuntimeError) as caught:
        runpy.run_path(str(script), run_name="__main__")
    assert script_globals(caught.value.__traceback__, str(script))["marker"] == 41
    assert script_globals(caught.value.__traceback__, str(tmp_path / "other.py")) is None


def test_the_doctor_records_the_trees_keys_with_the_values_the_run_used(tmp_path, monkeypatch, cfg_module):
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    result = run_doctor(DoctorConfig(command=["python", "train.py", "--trainer.batch_size=16"], steps=10,
                                     out=tmp_path / "run", system_sampler=False))
    assert result.steps == 10, result.traceback
    flags = [json.loads(line)["data"] for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()
             if '"script_flags"' in line]
    assert flags and flags[0]["source"] == "config_object"
    values = {r["dest"]: r["value"] for r in flags[0]["flags"]}
    assert values == {"system.seed": 3407, "system.work_dir": "./out", "trainer.num_workers": 0,
                      "trainer.batch_size": 16, "trainer.learning_rate": 5e-4}


def test_workers_that_outnumber_the_cores_are_told_to_be_fewer():
    flags = {"kind": "script_flags", "source": "config_object", "site": None, "flags": [
        {"option": "--trainer.num_workers", "dest": "trainer.num_workers", "value": 4, "type": "int", "kind": "equals"}]}
    loader = {**LOADER0, "num_workers": 4, "cores": 2}
    f = data.data_bound(ctx_of(make_run(shares={"data": 0.2, "forward": 0.4}, obs=[loader, flags])))
    assert f.recommendation.startswith("4 workers and the training process share 2 cores: use fewer "
                                       "(--trainer.num_workers=1, now --trainer.num_workers=4")
    assert "or none (--trainer.num_workers=0) when building a batch costs less" in f.recommendation
    assert "the script's flag: --trainer.num_workers=4" in f.evidence
