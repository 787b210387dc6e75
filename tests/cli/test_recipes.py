from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainspeed.cli.main import main

pytestmark = pytest.mark.timeout(60)


def test_recipes_lists_gpt_with_existing_config_paths(capsys):
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpt: GPT decoder")
    paths = [line.split()[1] for line in out.splitlines() if line.startswith("  ")]
    assert [Path(p).name for p in paths[:2]] == ["naive.yaml", "fast.yaml"]
    assert all(Path(p).is_file() for p in paths)


def test_recipes_json(capsys):
    assert main(["recipes", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    gpt = next(r for r in rows if r["name"] == "gpt")
    assert set(gpt) == {"name", "description", "naive", "fast"}
    assert Path(gpt["fast"]).is_file()
