"""A library installed outside site-packages is still a library. transformers 4.49 installed with
`pip install --target deps` and run with `PYTHONPATH=deps` (run_glue_no_trainer.py, session 25)
had its own host read (`modeling_attn_mask_utils.py:448`) read as the user's code: the advice
was "keep the value on the device" in a file the user does not own. Every part of the doctor
now reads a file's owner by one rule (patches/installed.py) with the run's own sys.path, and
each call site row carries the package the run found, so the report needs no sys.path."""

from __future__ import annotations

import textwrap

import pytest

from doctor_helpers import observations, run_inline
from trainspeed.doctor.checks import syncs
from trainspeed.patches import installed

LIBRARY = '''
def log_loss(loss):
    """A library helper that reads the loss back to the host at every call."""
    return float(loss.item())
'''

SCRIPT = '''
import sys
sys.path.insert(0, {deps!r})
sys.path.insert(0, {helpers!r})
import torch
import fakelib
import myhelpers
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 8), torch.randn(16, 1)
for step in range(60):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    fakelib.log_loss(loss)
    if step % 2 == 0:
        myhelpers.check(loss)
'''


def _layout(tmp_path):
    deps = tmp_path / "deps"  # `pip install --target deps`: the package and its dist-info
    (deps / "fakelib").mkdir(parents=True)
    (deps / "fakelib" / "__init__.py").write_text(textwrap.dedent(LIBRARY))
    (deps / "fakelib-1.0.dist-info").mkdir()
    (deps / "fakelib-1.0.dist-info" / "METADATA").write_text("Name: fakelib\nVersion: 1.0\n")
    helpers = tmp_path / "tools"  # the script's own helpers, put on sys.path by the script
    helpers.mkdir()
    (helpers / "myhelpers.py").write_text("def check(loss):\n    return bool(loss > 100)\n")
    return deps, helpers


@pytest.mark.timeout(120)
def test_a_target_folder_is_a_library_and_the_scripts_own_folder_is_not(tmp_path):
    deps, helpers = _layout(tmp_path)
    result = run_inline(tmp_path, SCRIPT.format(deps=str(deps), helpers=str(helpers)), steps=None)
    rows = [r for r in observations(result, "call_sites")[0]["rows"] if r["category"] == "sync"]
    library = next(r for r in rows if "fakelib" in r["site"])
    own = next(r for r in rows if "myhelpers" in r["site"])
    assert library["library"] == "fakelib" and "library" not in own
    assert syncs.library_of(library) == "fakelib" and syncs.library_of(own) is None
    assert "inside fakelib" in syncs._fix(library) and "not in your code" in syncs._fix(library)
    assert syncs._fix(own).startswith("For `return bool(loss > 100)`")


def test_the_rule_reads_dist_info_anywhere_and_egg_info_outside_the_project(tmp_path, monkeypatch):
    project, checkout, target = tmp_path / "proj", tmp_path / "elsewhere" / "src", tmp_path / "proj" / "deps"
    for folder in (project / "src" / "mine.egg-info", checkout / "lib.egg-info", target / "lib-1.0.dist-info"):
        folder.mkdir(parents=True)
    monkeypatch.setattr("sys.argv", [str(project / "train.py")])
    roots = installed.install_roots([str(project / "src"), str(checkout), str(target), str(project)],
                                    cwd=str(project))
    # The user's own project installed with `pip install -e` (its egg-info inside the working
    # directory) stays theirs; a library's checkout elsewhere and a --target folder are not.
    assert roots == (str(checkout) + "/", str(target) + "/")
    monkeypatch.setattr("sys.path", [str(project / "src"), str(checkout), str(target)])
    monkeypatch.chdir(project)
    assert installed.installed_package(str(checkout / "lib" / "x.py")) == "lib"
    assert installed.installed_path(str(target / "lib" / "y.py")) == "lib/y.py"
    assert not installed.is_installed(str(project / "src" / "mine" / "z.py"))
    assert installed.installed_package("/v/lib/python3.11/site-packages/torch/nn/f.py") == "torch"
