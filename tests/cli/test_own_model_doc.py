"""docs/own-model.md runs as written: its files are written to a fresh folder and its commands
run there (train a few steps, --help, --print-config, a one-knob tune), so the doc cannot rot."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from trainspeed.cli.main import main

pytestmark = pytest.mark.timeout(300)

DOC = Path(__file__).resolve().parents[2] / "docs" / "own-model.md"
ONE_THREAD = ["run.torch_threads=1"]  # intra-op threads spin; on a shared 2-core box 2x slower
# one baseline bracket and no final check: every trial is a fresh interpreter (~3 s), and the
# assertions read the ablation
# The work is the trials' count and length; the doc's --budget 2m is replaced by one that never
# binds: on a loaded machine (load 15 on 2 cores) the baseline trial took 56 s, the setting no
# longer fit the 2 minutes, and the tune exited 3 with nothing measured.
SHORT_TRIALS = ["--steps", "3", "--warmup-steps", "1", "--repeats", "1", "--max-rounds", "1", "--verify-repeats", "0",
                "--baseline-every", "10", "--budget", "30m",
                "--no-fork-server"]  # plain `python -m trainspeed train` trials: the cwd must be found there


def doc_files() -> dict[str, str]:
    return dict(re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", DOC.read_text(), re.S))


def doc_commands() -> list[list[str]]:
    block = re.search(r"<!-- commands -->\n```bash\n(.*?)```", DOC.read_text(), re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


@pytest.fixture()
def example(tmp_path, monkeypatch):
    for name, text in doc_files().items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    # As under the `trainspeed` console script: the cwd is not on sys.path until the recipe asks.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    sys.modules.pop("mymodel", None)


def test_the_doc_has_the_example_this_test_runs():
    assert set(doc_files()) == {"mymodel.py", "my.yaml"}
    commands = doc_commands()
    assert [c[:3] for c in commands] == [["trainspeed", "train", "my.yaml"]] * 3 + [["trainspeed", "tune", "my.yaml"]]
    assert commands[3][3:] == ["--knobs", "fused_optimizer", "--budget", "2m"]


@pytest.mark.slow  # 10-40 s: started first under xdist (tests/conftest.py)
def test_own_model_example_trains_helps_prints_and_tunes(example, capsys):
    import torch

    threads = torch.get_num_threads()
    train, helped, printed, tune = doc_commands()
    try:
        assert main(train[1:] + ["--no-report", *ONE_THREAD]) == 0
        (run_dir,) = (example / "runs").glob("mymodel-build-*")
        steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines() if line.strip()]
        assert max(r["step"] for r in steps) == 60  # run.max_steps of my.yaml
        capsys.readouterr()

        assert main(helped[1:]) == 0
        out = capsys.readouterr().out
        assert re.search(r"^  recipe\.options\.width +128\b", out, re.M)
        assert re.search(r"^  recipe\.options\.depth +2\b", out, re.M)

        assert main(printed[1:]) == 0
        resolved = yaml.safe_load(capsys.readouterr().out)
        # every option, the given width and the defaults of the rest (it printed `options: {width: 128}`)
        assert resolved["recipe"] == {"name": "mymodel:build", "options": {"width": 128, "depth": 2, "samples": 4096}}

        assert main(tune[1:] + SHORT_TRIALS + ONE_THREAD) == 0
    finally:
        torch.set_num_threads(threads)
    out = example / "runs" / "tune-mymodel-build-fused_optimizer"  # --knobs names the folder
    result = json.loads((out / "tune.json").read_text())
    why = (result["ablation"], result["notes"])
    assert result["baseline_cost_s_per_sample"], why  # the model's trials ran in fresh processes
    measured = [row for row in result["ablation"] if row["knob"] == "fused_optimizer"]
    assert any(row["speedup"] is not None for row in measured), why
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["recipe"]["name"] == "mymodel:build"
