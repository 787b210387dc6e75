from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainspeed.cli.main import main

pytestmark = pytest.mark.timeout(60)


def test_recipes_lists_gpt_with_existing_config_paths(capsys):
    assert main(["recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("gpt: GPT decoder"))
    assert lines[0].startswith("convnext: ")  # sorted by name
    paths = [line.split()[1] for line in lines if line.startswith("  ")]
    assert [Path(line.split()[1]).name for line in lines[at + 1 : at + 3]] == ["naive.yaml", "fast.yaml"]
    assert all(Path(p).is_file() for p in paths)


def test_recipes_json(capsys):
    assert main(["recipes", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    gpt = next(r for r in rows if r["name"] == "gpt")
    assert set(gpt) == {"name", "description", "naive", "fast"}
    assert Path(gpt["fast"]).is_file()


def test_recipes_lists_every_built_in_recipe(capsys):
    assert main(["recipes", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    expected = {"gpt", "convnext", "seqvae"}
    try:
        import transformers  # noqa: F401

        expected.add("hf")
    except ImportError:
        pass
    assert expected <= set(rows)
    for name in expected:
        assert Path(rows[name]["naive"]).is_file() and Path(rows[name]["fast"]).is_file()


def test_train_seqvae_fast_end_to_end(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setenv("TRAINSPEED_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    try:
        code = main(["train", "seqvae", "--variant", "fast", "--no-report", "run.max_steps=6",
                     f"run.out_dir={tmp_path}", "run.name=cli-sv", "run.torch_threads=1",
                     "logging.progress=false", "eval.every_steps=null", "eval.limit_val_batches=1",
                     "recipe.options.samples=96", "recipe.options.val_samples=8",
                     "recipe.options.max_len=120", "recipe.options.median_len=40",
                     "recipe.options.channels=16", "data.max_seq_len=120"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    assert "training seqvae" in capsys.readouterr().out
    run = tmp_path / "cli-sv"
    steps = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, 7))
    assert all(s["pad_share"] < 0.5 for s in steps)  # bucketing + dynamic padding
    evals = [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines()) if e["type"] == "eval"]
    assert len(evals) == 1 and "active_units" in evals[0]["data"]  # eval.at_end with collapse metrics
    assert json.loads((run / "report.json").read_text())["summary"]["tokens_per_s"] > 0


@pytest.mark.timeout(300)  # ~5 s of CPU; a subprocess that starts W&B's service on a shared 2-core machine
def test_no_report_keeps_wandb_from_printing_its_summary(tmp_path):
    # `train ... --no-report` with the wandb sink still printed W&B's "Run history / Run summary".
    import os
    import subprocess
    import sys

    pytest.importorskip("wandb")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path),
           "TRAINSPEED_CACHE": str(tmp_path / "cache")}
    env.pop("WANDB_QUIET", None)
    cmd = [sys.executable, "-m", "trainspeed", "train", "seqvae", "--no-report", "run.max_steps=3",
           f"run.out_dir={tmp_path}", "run.torch_threads=1", "logging.progress=false", "eval.every_steps=null",
           "eval.at_end=false", "logging.sinks=[jsonl,wandb]", "recipe.options.samples=32",
           "recipe.options.val_samples=8", "recipe.options.max_len=40", "recipe.options.median_len=20",
           "recipe.options.channels=8", "data.max_seq_len=40"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Run summary" not in res.stderr + res.stdout and "Run history" not in res.stderr + res.stdout
