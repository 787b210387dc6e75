"""A script that imports its own checkout's package (karpathy/minGPT: `python
projects/adder/adder.py` imports `mingpt`, two directories up). Without the checkout installed
the import fails, with or without the doctor; the doctor told the user to `pip install mingpt`,
which fetches another project or nothing. The fix names the checkout's root, and once the user
runs with `PYTHONPATH=.` every command the report suggests carries it, or it would fail the
same way."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainspeed.doctor.checks.missing_module import local_package_root, missing_module_advice
from trainspeed.doctor.instrument.import_path import needed_pythonpath

pytestmark = pytest.mark.timeout(120)

TRAIN = textwrap.dedent('''
    import argparse
    import torch
    from mypkg.model import build

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--log-every", type=int, default=1)
    args = p.parse_args()
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    for step in range(args.steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.log_every == 0:
            print(step, loss.item())  # a host read every step: a finding with a tune command
''')


def checkout(root: Path, installable: bool = True) -> Path:
    """minGPT's layout: the package at the root, the script two levels down."""
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "model.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(16, 1)\n")
    (root / "projects" / "demo").mkdir(parents=True)
    (root / "projects" / "demo" / "train.py").write_text(TRAIN)
    if installable:
        (root / "setup.py").write_text("from setuptools import setup\nsetup(name='mypkg', packages=['mypkg'])\n")
    return root / "projects" / "demo" / "train.py"


def doctor_cmd(path):
    return ("PYTHONPATH=" + path + " " if path else "") + "trainspeed doctor -- python projects/demo/train.py"


def test_the_package_is_found_above_the_script_and_named_from_where_the_user_runs(tmp_path):
    script = checkout(tmp_path)
    assert local_package_root("mypkg", script) == tmp_path
    assert local_package_root("numpy", script) is None
    error = "ModuleNotFoundError: No module named 'mypkg.model'"
    fix, verify = missing_module_advice(error, ["python", "projects/demo/train.py"], str(tmp_path), doctor_cmd, "x")
    assert "`mypkg` is a package of this checkout (./mypkg/)" in fix
    assert "(projects/demo) on the import path" in fix and "`python -m pip install -e .`" in fix
    assert "pip install mypkg" not in fix
    assert verify == "PYTHONPATH=. trainspeed doctor -- python projects/demo/train.py"
    # run from the script's own directory: the root is two levels up, as typed from there
    fix, verify = missing_module_advice(error, ["python", "train.py"], str(script.parent), doctor_cmd, "x")
    assert verify.startswith("PYTHONPATH=../.. ") and "pip install -e ../.." in fix


def test_a_module_not_in_the_checkout_is_installed_under_its_pip_name(tmp_path):
    script = checkout(tmp_path)
    for error, pip in (("ModuleNotFoundError: No module named 'cv2'", "opencv-python"),
                       ("ModuleNotFoundError: No module named 'einops'", "einops")):
        fix, verify = missing_module_advice(error, ["python", str(script)], str(tmp_path), doctor_cmd, "`pip install -e T`")
        assert f"`python -m pip install {pip}`" in fix and "`pip install -e T`" in fix
        assert verify == doctor_cmd(None)


def test_the_search_stops_at_the_checkouts_root_and_skips_the_scripts_own_directory(tmp_path):
    outer = tmp_path / "outer"
    script = checkout(outer / "repo", installable=False)
    (outer / "repo" / ".git").mkdir()
    (outer / "other").mkdir()
    (outer / "other.py").write_text("")  # above the checkout's root: not this script's package
    assert local_package_root("other", script) is None
    (script.parent / "helpers.py").write_text("")  # on the path already: the path was not the problem
    assert local_package_root("helpers", script) is None
    fix, _ = missing_module_advice("ModuleNotFoundError: No module named 'mypkg'", ["python", str(script)],
                                   str(outer / "repo"), doctor_cmd, "x")
    assert "`PYTHONPATH=.`" in fix and "pip install -e" not in fix  # no setup.py/pyproject: nothing to install


def test_only_the_pythonpath_entries_the_script_imported_from_are_needed(tmp_path, monkeypatch):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "ts_used_mod.py").write_text("X = 1\n")
    (tmp_path / "idle").mkdir()
    src = str(Path(__file__).resolve().parents[2] / "src")  # trainspeed's own: never needed by the script
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([src, "idle", "used"]))
    assert needed_pythonpath() is None
    monkeypatch.syspath_prepend(str(tmp_path / "used"))
    import ts_used_mod  # noqa: F401

    try:
        assert needed_pythonpath() == "used"
        assert needed_pythonpath(script_dir=str(tmp_path / "used")) is None  # the script's own directory
    finally:
        sys.modules.pop("ts_used_mod", None)


@pytest.mark.slow
def test_the_crash_advice_runs_as_written_and_the_next_report_keeps_the_path(tmp_path, monkeypatch):
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    checkout(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = run_doctor(DoctorConfig(command=["python", "projects/demo/train.py"], out=tmp_path / "crashed",
                                     steps=8, system_sampler=False))
    first = result.findings[0]
    assert first["id"] == "crashed_before_training"
    # the run's own length is carried (the user typed --steps 8)
    assert first["verify_with"] == "PYTHONPATH=. trainspeed doctor --steps 8 -- python projects/demo/train.py"
    # the user runs it as printed (the shell reads the PYTHONPATH= prefix), a little longer
    verify = first["verify_with"].replace("--steps 8", "--steps 12 --out after --no-html")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    if not Path(sys.executable).with_name("trainspeed").exists():  # trainspeed run from a source tree
        verify = verify.replace("trainspeed doctor", f"{shlex.quote(sys.executable)} -m trainspeed doctor")
        env["TS_SRC"] = str(Path(__file__).resolve().parents[2] / "src")
        verify = verify.replace("PYTHONPATH=.", "PYTHONPATH=.:$TS_SRC")
    proc = subprocess.run(["bash", "-c", verify], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "after" / "report.json").read_text())
    assert report["summary"]["steps"] == 12
    commands = {f["id"]: f["verify_with"] for f in report["findings"] if f.get("verify_with")}
    assert commands["host_syncs"].startswith("PYTHONPATH=. trainspeed doctor --steps 12 -- python projects/demo/train.py "
                                             "--log-every 50"), commands
    assert commands["not_compiled"] == "PYTHONPATH=. trainspeed tune --knobs compile -- python projects/demo/train.py"
