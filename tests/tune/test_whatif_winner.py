"""A what-if winner of a real script tune comes back as code: the checkpoint what-if of a loop
that saves under a literal interval wins, is verified, and best.patch changes the literal."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from trainspeed.tune.options import TuneOptions
from trainspeed.tune.script_session import run_script_tune
from trainspeed.tune.script_trials import ScriptRunner

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(shutil.which("git") is None, reason="git apply checks the patch")]
pytest.importorskip("libcst")

SCRIPT = '''import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = {"big": torch.randn(2_000_000)}
for step in range(100000):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 2 == 0:
        torch.save(state, "ckpt.pt")
'''


class QuietRunner(ScriptRunner):
    """Real trials whose load readings are set to 'not sampled': this test is about the
    what-if's edit; load-proofing has its own tests with injected loads."""

    def __call__(self, request):
        result = super().__call__(request)
        result.others_load = None
        return result


def test_a_checkpoint_whatif_winner_is_verified_and_comes_back_as_the_changed_literal(tmp_path, monkeypatch):
    user = tmp_path / "project"
    user.mkdir()
    (user / "train.py").write_text(SCRIPT)
    subprocess.run(["git", "init", "-q"], cwd=user, check=True)
    monkeypatch.chdir(user)
    out = user / "runs" / "tune"
    command = ["python", "train.py"]
    # the trials' count and length fix the work (1 repeat, 2 verification rounds); a budget that
    # never binds: at load 19 on 2 cores 240 s ran out before the verification (no winner kept)
    options = TuneOptions(knobs=["checkpoint_every"], budget_s=3600, repeats=1, verify_repeats=2)
    runner = QuietRunner(base_config=out / "best.yaml", out_dir=out / "trials", command=command, warmup_steps=3,
                         measure_steps=30, timeout_s=120, fork_server=options.fork_server, say=lambda s: None)
    result = run_script_tune(command, out, options, warmup_steps=3, measure_steps=30, runner=runner,
                             say=lambda s: None)

    row = next(r for r in result.ablation if r.knob == "checkpoint_every")
    assert row.settings == {"whatif.save_every": 4}
    assert row.verdict == "faster", (row.verdict, row.speedup, row.note)
    assert row.note.startswith("what-if: an edit of your code does this")
    # the verification measured the what-if, which keeps exactly the saves the edit keeps
    assert result.best_settings == {"whatif.save_every": 4} and result.final.verdict == "faster"
    patch = (out / "best.patch").read_text()
    assert "-    if step % 2 == 0:\n+    if step % 8 == 0:\n" in patch
    subprocess.run(["git", "apply", "--check", str(out / "best.patch")], cwd=user, check=True)
    # best.yaml does not thin the patched loop a second time
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert "whatif.save_every" not in (best.get("settings") or {})
    assert "apply best.patch" in (out / "best.yaml").read_text()
    assert Path(user / "train.py").read_text() == SCRIPT  # the user's file was only read
