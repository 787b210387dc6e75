"""best.patch's what-if edits run for real (edited_source.py): `code.log_every=3` runs the
script and the sibling module it imports with the edit made in their source, under their own
paths and the user's working directory; the user's files are only read."""

from __future__ import annotations

import gc
import io
import sys
import textwrap

import pytest

from trainspeed.errors import ConfigError
from trainspeed.patches import install_settings
from trainspeed.patches.targets import Targets

pytest.importorskip("libcst")

MAIN = '''\
import os
from helper import report

DATA = open("data.txt").read()  # relative to the working directory
HERE = __file__
for step in range(12):
    print("main", step)  # MAIN
    report(step)
'''
HELPER = '''\
def report(step):
    if step % 2 == 0:
        print("helper", step)  # HELPER
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(MAIN)
    (tmp_path / "helper.py").write_text(HELPER)
    (tmp_path / "data.txt").write_text("rows")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # the script's directory, as runpy's caller puts it
    monkeypatch.delitem(sys.modules, "helper", raising=False)
    yield tmp_path
    sys.modules.pop("helper", None)


def run(project, settings, targets, capsys):
    from trainspeed.doctor.runner import Target, execute

    applied = install_settings(settings, targets, say=lambda text: None)
    try:
        execute(Target(kind="path", name="train.py", args=[]))
    finally:
        applied.uninstall()
    return capsys.readouterr().out.split("\n"), applied.notes


def test_the_script_and_its_sibling_module_run_the_edit_best_patch_makes(project, capsys):
    main, helper = str(project / "train.py"), str(project / "helper.py")
    targets = Targets(script=main, log_sites=((main, 7), (helper, 3)))
    lines, notes = run(project, {"code.log_every": 3}, targets, capsys)
    # the per-step print moved under `if step % 3 == 0:`, the helper's interval 2 -> 6
    assert [x for x in lines if x.startswith("main")] == [f"main {s}" for s in (0, 3, 6, 9)]
    assert [x for x in lines if x.startswith("helper")] == ["helper 0", "helper 6"]
    assert notes == ["code edit: code.log_every=3: the script ran with best.patch's edit made in its source, not "
                     "the what-if: helper.py:3: the interval on line 2, 2 -> 6; train.py:7: moved under `if step % 3 == 0:`"]
    assert (project / "train.py").read_text() == MAIN and (project / "helper.py").read_text() == HELPER
    # uninstalled: the same script runs as written again
    sys.modules.pop("helper", None)
    lines, _ = run(project, {}, targets, capsys)
    assert len([x for x in lines if x.startswith("main")]) == 12 and len([x for x in lines if x.startswith("helper")]) == 6


def test_the_edited_script_keeps_its_file_name_and_working_directory(project, capsys):
    import runpy

    main = str(project / "train.py")
    open_code = io.open_code
    applied = install_settings({"code.log_every": 4}, Targets(script=main, log_sites=((main, 7),)),
                               say=lambda text: None)
    try:
        g = runpy.run_path(main, run_name="__main__")
    finally:
        applied.uninstall()
    assert g["HERE"] == main and g["DATA"] == "rows"
    assert io.open_code is open_code  # restored
    assert not any(type(f).__name__ == "EditedSources" for f in sys.meta_path)


def test_an_edit_that_cannot_be_made_stops_the_run_before_the_script_starts(project):
    main = str(project / "train.py")
    before = (io.open_code, list(sys.meta_path), gc.collect)
    # line 4 holds no print: the file changed since the sites were recorded
    with pytest.raises(ConfigError, match=r"code.log_every=3: the edit could not be made at train.py:4"):
        install_settings({"code.log_every": 3}, Targets(script=main, log_sites=((main, 4),)), say=lambda t: None)
    with pytest.raises(ConfigError, match="no whatif.save_every call site was recorded"):
        install_settings({"code.save_every": 3}, Targets(script=main), say=lambda t: None)
    assert (io.open_code, list(sys.meta_path), gc.collect) == before  # nothing stays installed


def test_a_file_that_no_longer_compiles_once_edited_is_refused(tmp_path):
    # a call under an interval whose block is valid for LibCST but not for the compiler
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent('''\
        for step in range(4):
            print(step)
        nonlocal_misuse = 1
        def f():
            nonlocal nonlocal_misuse
    '''))
    with pytest.raises(ConfigError, match="does not compile once edited"):
        install_settings({"code.log_every": 2}, Targets(script=str(path), log_sites=((str(path), 2),)),
                         say=lambda t: None)


def test_a_module_run_with_python_m_runs_the_per_step_call_moved_under_an_interval(tmp_path, monkeypatch):
    # `python -m trainmod`: runpy imports it through the finders, so the edited text comes from
    # the import finder, not io.open_code
    from trainspeed.doctor.runner import Target, execute

    (tmp_path / "trainmod.py").write_text("import gc\n\nfor step in range(20):\n    gc.collect()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "trainmod", raising=False)
    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(1) or 0)
    path = str(tmp_path / "trainmod.py")
    applied = install_settings({"code.gc_every": 5}, Targets(script=path, gc_sites=((path, 4),)), say=lambda t: None)
    try:
        execute(Target(kind="module", name="trainmod", args=[]))
    finally:
        applied.uninstall()
        sys.modules.pop("trainmod", None)
    assert len(calls) == 4  # steps 0, 5, 10, 15
    assert applied.notes[0].endswith("trainmod.py:4: moved under `if step % 5 == 0:`")
