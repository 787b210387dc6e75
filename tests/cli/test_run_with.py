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
