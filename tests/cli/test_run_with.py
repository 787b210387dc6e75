"""`trainspeed run --with best.yaml -- CMD` says which settings it applies (issue #30)."""

from __future__ import annotations

import pytest
import yaml

from trainspeed.cli.main import main

pytestmark = pytest.mark.timeout(60)

SCRIPT = """import argparse
p = argparse.ArgumentParser()
p.add_argument("--workers", type=int, default=0)
p.add_argument("--lr", type=float, default=0.1)
print("workers", p.parse_args().workers)
"""


def _plan(path, settings):
    path.write_text(yaml.safe_dump({"schema": 1, "kind": "script-settings", "command": ["python", "train.py"],
                                    "settings": settings, "flag_styles": {}, "targets": {}}))
    return str(path)


def test_run_with_lists_the_settings_it_applies(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    best = _plan(tmp_path / "best.yaml", {"args.--workers": 2})
    assert main(["run", "--with", best, "--", "python", "train.py", "--workers", "0", "--lr", "1"]) == 0
    out = capsys.readouterr()
    assert f"applying 1 setting from {best}: --workers 2" in out.err
    assert "workers 2" in out.out  # set in place of the command's own --workers 0
    none = _plan(tmp_path / "none.yaml", {})
    assert main(["run", "--with", none, "--", "python", "train.py"]) == 0
    assert "applying no settings" in capsys.readouterr().err


def test_run_with_a_plan_tuned_on_another_script_warns(tmp_path, monkeypatch, capsys):
    """The demo's best.yaml applied to word_language_model's main.py ran without a word."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "main.py").write_text(SCRIPT)
    best = tmp_path / "best.yaml"
    best.write_text(yaml.safe_dump({"schema": 1, "kind": "script-settings", "command": ["python", "train.py"],
                                    "settings": {"args.--workers": 2}, "flag_styles": {},
                                    "targets": {"script": str(tmp_path / "train.py")}}))
    assert main(["run", "--with", str(best), "--", "python", "main.py", "--lr", "1"]) == 0
    err = capsys.readouterr().err
    assert f"warning: these settings were tuned on {tmp_path / 'train.py'}, not main.py" in err
    assert err.rstrip().endswith("measure them here with trainspeed tune -- python main.py --lr 1")
    assert main(["run", "--with", str(best), "--", "python", "train.py"]) == 0  # its own script: quiet
    assert "warning" not in capsys.readouterr().err


LOOP = """import torch
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(12):
    loss = model(torch.randn(16, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_run_with_doctor_measures_mfu(tmp_path, monkeypatch, capsys):
    # `run --with best.yaml --doctor` showed MFU "not measured": it never counted the FLOPs; the
    # demo's after-run is --quiet, and its compare showed the same.
    import json

    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAINSPEED_CACHE", str(tmp_path / "cache"))
    (tmp_path / "train.py").write_text(LOOP)
    best = _plan(tmp_path / "best.yaml", {})
    threads = torch.get_num_threads()
    try:
        code = main(["run", "--with", best, "--doctor", "--quiet", "--steps", "10", "--out", str(tmp_path / "r"), "--",
                     "python", "train.py"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    summary = json.loads((tmp_path / "r" / "report.json").read_text())["summary"]
    mfu = summary["mfu"]
    assert isinstance(mfu, dict) and mfu.get("value") is not None and 0 < mfu["value"] < 1, mfu
