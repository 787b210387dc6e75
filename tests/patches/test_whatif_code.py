"""What-if winners as code (whatif_code.py): the literal interval changed, or the per-step call
moved under one, in a best.patch that `git apply --check` takes."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from trainspeed.patches.code_change import code_change
from trainspeed.patches.targets import Targets
from trainspeed.patches.whatif_code import IntervalEdit, realizable, realize

pytest.importorskip("libcst")

LOOP = '''import gc
import torch


def train(model, loader, opt, steps):
    for step in range(steps):
        loss = model(step)
        # keep a checkpoint
        if step % 5 == 0:
            torch.save(model.state_dict(), "ckpt.pt")  # the last one wins
        gc.collect()
        if step > 3:
            print("late")
    for i, batch in enumerate(loader, 0):
        print(i,
              batch)
    while True:
        gc.collect()
        break
'''


def test_a_literal_interval_is_multiplied_and_a_per_step_call_moved_under_one():
    new, out = realize(LOOP, [IntervalEdit("whatif.save_every", 10, 4), IntervalEdit("whatif.gc_every", 11, 100),
                              IntervalEdit("whatif.log_every", 16, 10)])
    assert [o.done for o in out] == ["the interval on line 9, 5 -> 20", "moved under `if step % 100 == 0:`",
                                     "moved under `if i % 10 == 0:`"]
    assert "        if step % 20 == 0:\n            torch.save(model.state_dict(), \"ckpt.pt\")  # the last one wins\n" in new
    assert "        # keep a checkpoint\n" in new  # comments stay
    assert "        if step % 100 == 0:\n            gc.collect()\n" in new
    assert "        if i % 10 == 0:\n            print(i,\n                  batch)\n" in new


def test_calls_that_no_edit_matches_are_left_alone_and_say_why():
    new, out = realize(LOOP, [IntervalEdit("whatif.log_every", 13, 10), IntervalEdit("whatif.gc_every", 18, 10),
                              IntervalEdit("whatif.save_every", 7, 4)])
    assert new == LOOP
    assert "condition that is not an `if x % N == 0` interval" in out[0].why_not
    assert "no counter from 0" in out[1].why_not  # a while loop
    assert "no save call" in out[2].why_not


def test_the_edit_keeps_the_calls_the_what_if_kept():
    # the what-if runs the 1st, (k+1)th, ... call of a site: at `step % 5` with k=4, steps 0, 20, 40
    steps = range(100)
    what_if = [s for s in steps if s % 5 == 0][::4]
    assert what_if == [s for s in steps if s % 20 == 0]
    assert list(steps)[::7] == [s for s in steps if s % 7 == 0]  # a per-step call moved under `step % 7`


def _project(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text(LOOP)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


@pytest.mark.skipif(shutil.which("git") is None, reason="git apply checks the patch")
def test_a_whatif_winner_comes_back_as_a_patch_that_applies(tmp_path):
    root = _project(tmp_path)
    path = str(root / "train.py")
    targets = Targets(script=path, save_sites=((path, 10),), gc_sites=((path, 11),))
    assert realizable({"whatif.save_every": 4, "whatif.gc_every": 100}, targets)
    change = code_change({"whatif.save_every": 4, "whatif.gc_every": 100}, targets, root=root,
                         command=["python", "train.py"])
    assert "-        if step % 5 == 0:\n+        if step % 20 == 0:\n" in change.patch
    assert "-        gc.collect()\n+        if step % 100 == 0:\n+            gc.collect()\n" in change.patch
    assert change.edits == [
        "whatif.save_every: train.py:10: the interval on line 9, 5 -> 20 (what the tune measured as the what-if)",
        "whatif.gc_every: train.py:11: moved under `if step % 100 == 0:` (what the tune measured as the what-if)"]
    assert not any("the script was not changed" in n for n in change.notes)
    change.write(tmp_path / "out")
    subprocess.run(["git", "apply", "--check", str(tmp_path / "out" / "best.patch")], cwd=root, check=True)
    subprocess.run(["git", "apply", str(tmp_path / "out" / "best.patch")], cwd=root, check=True)
    compile((root / "train.py").read_text(), "train.py", "exec")


def test_a_whatif_with_a_site_no_edit_can_make_is_no_winner_and_stays_a_note(tmp_path):
    root = _project(tmp_path)
    path = str(root / "train.py")
    # the save at line 10 can be edited, the while loop's gc.collect at line 18 cannot: the
    # what-if thinned both, so an edit of one would not be what was measured
    targets = Targets(script=path, gc_sites=((path, 11), (path, 18)))
    assert not realizable({"whatif.gc_every": 100}, targets)
    assert not realizable({"whatif.no_gc": True}, targets)  # removal is no interval
    assert not realizable({"whatif.save_every": 4}, Targets(script=path))  # no site recorded
    change = code_change({"whatif.save_every": 4}, Targets(script=path), root=root, command=[])
    assert change.patch == "" and any("the script was not changed" in n for n in change.notes)


def test_targets_keep_their_call_sites_through_a_plan():
    t = Targets(save_sites=(("/p/train.py", 10),), log_sites=(("/p/train.py", 3), ("/p/log.py", 9)))
    d = t.to_dict()
    assert d["save_sites"] == [["/p/train.py", 10]] and d["gc_sites"] == []
    assert Targets.from_dict(d) == t
